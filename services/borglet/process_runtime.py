"""The ``process`` task runtime: a real command, as an unprivileged user, in its own session and cgroup.

Each task runs in a new session (so its process group can be signalled as a whole, the
way Borg kills a task's container, Borg §2.3), as the task account of :mod:`task_sandbox`
in a working directory of its own, with a clean environment, no inherited file descriptors
and stdout and stderr in a log file of the Borglet's.

Limits (Borg §6.2): where the host delegates a cgroup v2 subtree (:mod:`task_cgroups`), each
task gets its own cgroup: ``memory.max`` caps a hard memory limit (the kernel's OOM kill
shows in ``memory.events``), ``cpu.max`` caps CPU and ``cpu.stat`` says when the kernel
throttled it; usage is read from the cgroup. Elsewhere usage is metered from the task's
process tree with psutil (resident memory, CPU time over wall time) and the Borglet's own
enforcement kills a task over its hard limit and only records CPU above the limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import psutil

from cellpilot.borg.cgroup_v2 import CgroupUsage
from cellpilot.borglet.hosted_task import HostedTask, Limits, ProcessPlan
from cellpilot.platform.launch_as import launch_spec, launcher_argv, write_spec
from cellpilot.platform.system_accounts import RunAs
from cellpilot_services.borglet.task_cgroups import TaskCgroups
from cellpilot_services.borglet.task_sandbox import (
    check_exec_strings,
    make_working_dir,
    resolve_command,
    task_environment,
)

log = logging.getLogger(__name__)

CGROUP_REMOVE_TRIES = 40
CGROUP_REMOVE_PAUSE_S = 0.05


@dataclass
class ProcessHandle:
    process: asyncio.subprocess.Process
    pid: int
    log_file: IO[bytes]
    working_dir: Path | None = None
    cgroup: Path | None = None
    cpu_millicores: float = 0.0  # latest metering
    memory_bytes: int = 0
    kernel_throttled: bool = False  # the kernel throttled it since the previous metering
    # Unmet CPU demand since the previous metering, millicores: the time the kernel held it
    # throttled (cpu.stat throttled_usec) per wall second — the demand of one runnable thread
    # it did not serve, so a lower bound for a task with several.
    throttled_millicores: float = 0.0
    last_cpu_seconds: float = 0.0
    last_wall: float = field(default_factory=time.monotonic)
    # Cumulative counters of its cgroup (cpu.stat, memory.events, memory.peak).
    throttled_periods: int = 0
    throttled_usec: int = 0
    oom_kills: int = 0
    memory_peak: int = 0
    exited: asyncio.Event = field(default_factory=asyncio.Event)

    def record_cgroup(self, usage: CgroupUsage) -> None:
        self.kernel_throttled = usage.cpu.nr_throttled > self.throttled_periods
        self.throttled_periods = usage.cpu.nr_throttled
        self.throttled_usec = usage.cpu.throttled_usec
        self.oom_kills = usage.memory_events.oom_kill
        self.memory_peak = max(self.memory_peak, usage.memory_peak or usage.memory_current)


class ProcessRunner:
    def __init__(
        self,
        work_dir: Path,
        base_env: dict[str, str],
        cgroups: TaskCgroups | None,
        account: RunAs | None = None,
    ) -> None:
        self.work_dir = work_dir
        self.base_env = base_env
        self.cgroups = cgroups
        self.account = account or RunAs()

    def log_path(self, record: HostedTask) -> Path:
        working_dir = self.working_dir(record)
        return working_dir.parent / f"{working_dir.name}.log"

    def working_dir(self, record: HostedTask) -> Path:
        plan = record.plan
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{plan.job_id}.{plan.task_index}.{plan.incarnation}")
        return self.work_dir / record.machine_id / safe

    @staticmethod
    def identity_env(record: HostedTask) -> dict[str, str]:
        plan = record.plan
        return {
            "CELLPILOT_TASK_JOB_ID": plan.job_id,
            "CELLPILOT_TASK_INDEX": str(plan.task_index),
            "CELLPILOT_TASK_INCARNATION": str(plan.incarnation),
            "CELLPILOT_TASK_PORTS": ",".join(str(p) for p in plan.ports),
            "CELLPILOT_MACHINE_ID": record.machine_id,
        }

    async def spawn(self, record: HostedTask) -> ProcessHandle:
        """Start the task's command as the task account, in a new session, its own working
        directory and (where the host allows) its own cgroup; raises (OSError, ValueError) if it cannot."""
        plan = record.plan
        runtime = plan.runtime
        assert isinstance(runtime, ProcessPlan)
        working_dir = self.working_dir(record)
        make_working_dir(working_dir, self.account)
        env = task_environment(self.base_env, dict(runtime.env), working_dir, self.identity_env(record))
        path = self.log_path(record)
        cgroup: Path | None = None
        log_file: IO[bytes] | None = None
        try:
            check_exec_strings((runtime.command, *runtime.args), env)
            executable = resolve_command(runtime.command, env.get("PATH", ""), working_dir)
            log_file = os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640), "ab")
            if self.cgroups is not None:
                limits = plan.limits
                cgroup = self.cgroups.create(
                    plan.name, limits.cpu_millicores, limits.memory_bytes, plan.hard_memory_limit
                )
            process = await self._start(executable, runtime.args, env, working_dir, log_file, cgroup)
        except Exception:  # OSError (no such command, permission denied), ValueError (a NUL byte)
            if log_file is not None:
                log_file.close()
            if cgroup is not None:
                TaskCgroups.remove(cgroup)
            shutil.rmtree(working_dir, ignore_errors=True)
            raise
        handle = ProcessHandle(process, process.pid, log_file, working_dir=working_dir, cgroup=cgroup)
        handle.last_cpu_seconds = self._usage(handle)[0]
        return handle

    async def _start(
        self,
        executable: str,
        args: tuple[str, ...],
        env: dict[str, str],
        cwd: Path,
        log_file: IO[bytes],
        cgroup: Path | None,
    ) -> asyncio.subprocess.Process:
        """Run the launcher (empty environment), which joins the cgroup, drops to the task account
        and execs the command with ``env``; the launch description goes through a pipe."""
        account = self.account
        launch = launch_spec(
            executable,
            args,
            env,
            uid=account.uid,
            gid=account.gid,
            groups=account.groups(),
            cgroup=str(cgroup) if cgroup is not None else "",
        )
        spec_read, spec_write = os.pipe()
        try:
            try:
                process = await asyncio.create_subprocess_exec(
                    *launcher_argv(spec_read),
                    env={},
                    cwd=cwd,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=asyncio.subprocess.STDOUT,
                    start_new_session=True,
                    pass_fds=(spec_read,),
                )
            finally:
                os.close(spec_read)
        except BaseException:
            os.close(spec_write)
            raise
        write_spec(spec_write, launch)
        return process

    def meter(self, handle: ProcessHandle) -> None:
        """Refresh the handle's CPU rate, memory and throttling (from its cgroup, else its process tree)."""
        now = time.monotonic()
        throttled_before = handle.throttled_usec
        cpu_seconds, memory = self._usage(handle)
        elapsed = now - handle.last_wall
        if elapsed > 0:
            handle.cpu_millicores = max(0.0, cpu_seconds - handle.last_cpu_seconds) / elapsed * 1000.0
            throttled_s = max(0, handle.throttled_usec - throttled_before) / 1e6
            handle.throttled_millicores = throttled_s / elapsed * 1000.0
        handle.last_cpu_seconds = cpu_seconds
        handle.last_wall = now
        handle.memory_bytes = memory

    def _usage(self, handle: ProcessHandle) -> tuple[float, int]:
        """CPU seconds used so far and memory now: the cgroup's counters, else the process tree's."""
        if handle.cgroup is not None:
            usage = TaskCgroups.read_usage(handle.cgroup)
            if usage is not None:
                handle.record_cgroup(usage)
                return usage.cpu.usage_usec / 1e6, usage.memory_current
        cpu = 0.0
        rss = 0
        try:
            root = psutil.Process(handle.pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            return handle.last_cpu_seconds, 0
        for process in tree:
            try:
                with process.oneshot():
                    times = process.cpu_times()
                    cpu += times.user + times.system
                    rss += process.memory_info().rss
            except psutil.Error:
                continue
        return cpu, rss

    async def run_check(
        self, record: HostedTask, argv: tuple[str, ...], timeout_s: float
    ) -> tuple[bool, str]:
        """A health check command (Borg §2.6) run as the task: its account, working directory,
        environment and cgroup; output to its log. (passed, what happened)."""
        handle = record.process
        runtime = record.plan.runtime
        if not isinstance(handle, ProcessHandle) or handle.working_dir is None:
            return False, "the task has no process to check"
        assert isinstance(runtime, ProcessPlan)
        working_dir = handle.working_dir
        env = task_environment(self.base_env, dict(runtime.env), working_dir, self.identity_env(record))
        try:
            check_exec_strings(argv, env)
            executable = resolve_command(argv[0], env.get("PATH", ""), working_dir)
            fd = os.open(self.log_path(record), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
            with os.fdopen(fd, "ab") as log_file:
                process = await self._start(executable, argv[1:], env, working_dir, log_file, handle.cgroup)
        except (OSError, ValueError) as error:
            return False, f"could not run {argv[0]!r}: {error}"
        try:
            code = await asyncio.wait_for(process.wait(), timeout=timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
            return False, f"command {argv[0]!r} did not finish within {timeout_s:g} s"
        return code == 0, f"command {argv[0]!r} exited with code {code}"

    def update_limits(self, handle: ProcessHandle, limits: Limits, hard_memory_limit: bool) -> None:
        """New limits for a running task, written to its cgroup in place (Borg §2.3)."""
        if handle.cgroup is None:
            return
        try:
            TaskCgroups.set_limits(
                handle.cgroup, limits.cpu_millicores, limits.memory_bytes, hard_memory_limit
            )
        except OSError as error:
            log.warning("could not update a task's cgroup limits", extra={"error": str(error)})

    @staticmethod
    def signal(handle: ProcessHandle, sig: signal.Signals) -> None:
        """Signal the task's whole process group; SIGKILL also reaches what left it (its cgroup,
        or the processes it started that are still its descendants)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(handle.pid, sig)
        if sig != signal.SIGKILL:
            return
        if handle.cgroup is not None:
            TaskCgroups.kill(handle.cgroup)
            return
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(handle.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    child.kill()

    async def wait(self, handle: ProcessHandle) -> int:
        """Wait for the task's process to exit; kill what is left of it; read its cgroup's last
        counters (an OOM kill by the kernel); remove its cgroup and working directory."""
        code = await handle.process.wait()
        self.signal(handle, signal.SIGKILL)
        handle.log_file.close()
        if handle.cgroup is not None:
            usage = TaskCgroups.read_usage(handle.cgroup)
            if usage is not None:
                handle.record_cgroup(usage)
            for _ in range(CGROUP_REMOVE_TRIES):
                if TaskCgroups.remove(handle.cgroup):
                    break
                await asyncio.sleep(CGROUP_REMOVE_PAUSE_S)
            else:
                log.warning("a task's cgroup still holds processes", extra={"cgroup": str(handle.cgroup)})
        if handle.working_dir is not None:
            await asyncio.to_thread(shutil.rmtree, handle.working_dir, True)
        handle.exited.set()
        return int(code)
