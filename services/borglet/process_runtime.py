"""The ``process`` task runtime: a real command in its own process group, metered with psutil.

Each task runs in a new session (so its process group can be signalled as a whole, the
way Borg kills a task's container, Borg §2.3), with stdout and stderr in a log file under
the work directory. Metering every second reads the resident memory and CPU time of the
task's whole process tree; the CPU rate is the CPU time used over the wall time elapsed.

CPU limits (Borg §6.2: CFS bandwidth control): where a cgroup v2 hierarchy with the ``cpu``
controller is writable, each task gets its own cgroup and ``cpu.max`` caps it at its limit,
and ``cpu.stat`` tells whether the kernel throttled it. Elsewhere the Borglet cannot cap
the process, and only records it as throttled when it ran above its limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import psutil

from cellpilot_services.borglet.task_record import ProcessPlan, TaskRecord

log = logging.getLogger(__name__)

CPU_PERIOD_US = 100_000


class CgroupCpu:
    """cgroup v2 CPU bandwidth limits for task processes, under one directory of our own."""

    def __init__(self, base: Path) -> None:
        self.base = base

    @classmethod
    def detect(cls, root_setting: str, instance: str) -> CgroupCpu | None:
        """A controller if ``root`` is a writable cgroup v2 directory offering ``cpu``, else None."""
        if root_setting == "none":
            return None
        root = Path(root_setting or "/sys/fs/cgroup")
        try:
            if "cpu" not in (root / "cgroup.controllers").read_text().split():
                return None
            if "cpu" not in (root / "cgroup.subtree_control").read_text().split():
                (root / "cgroup.subtree_control").write_text("+cpu")
            base = root / f"cellpilot-borglet-{instance}"
            base.mkdir(exist_ok=True)
            (base / "cgroup.subtree_control").write_text("+cpu")
        except OSError as error:
            log.info(
                "cgroup v2 cpu controller not writable; CPU limits only recorded", extra={"error": str(error)}
            )
            return None
        return cls(base)

    def attach(self, task_name: str, pid: int, cpu_limit_millicores: int) -> Path | None:
        path = self.base / re.sub(r"[^A-Za-z0-9_.-]", "_", task_name)
        try:
            path.mkdir(exist_ok=True)
            (path / "cgroup.procs").write_text(str(pid))
            self.set_limit(path, cpu_limit_millicores)
        except OSError as error:
            log.warning("could not put a task in its cgroup", extra={"task": task_name, "error": str(error)})
            return None
        return path

    @staticmethod
    def cpu_max(cpu_limit_millicores: int) -> str:
        """The ``cpu.max`` line for a limit: quota and period in µs ("max" = no limit)."""
        if cpu_limit_millicores <= 0:
            return f"max {CPU_PERIOD_US}"
        quota = max(1000, cpu_limit_millicores * CPU_PERIOD_US // 1000)
        return f"{quota} {CPU_PERIOD_US}"

    def set_limit(self, path: Path, cpu_limit_millicores: int) -> None:
        (path / "cpu.max").write_text(self.cpu_max(cpu_limit_millicores))

    @staticmethod
    def throttled_periods(path: Path) -> int:
        try:
            for line in (path / "cpu.stat").read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == "nr_throttled":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    @staticmethod
    def release(path: Path) -> None:
        with contextlib.suppress(OSError):
            path.rmdir()


@dataclass
class ProcessHandle:
    process: asyncio.subprocess.Process
    pid: int
    log_file: IO[bytes]
    cgroup: Path | None = None
    cpu_millicores: float = 0.0  # latest metering
    memory_bytes: int = 0
    kernel_throttled: bool = False
    last_cpu_seconds: float = 0.0
    last_wall: float = field(default_factory=time.monotonic)
    last_throttled_periods: int = 0
    exited: asyncio.Event = field(default_factory=asyncio.Event)


class ProcessRunner:
    def __init__(self, work_dir: Path, base_env: dict[str, str], cgroup: CgroupCpu | None) -> None:
        self.work_dir = work_dir
        self.base_env = base_env
        self.cgroup = cgroup

    def log_path(self, record: TaskRecord) -> Path:
        plan = record.plan
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{plan.job_id}.{plan.task_index}.{plan.incarnation}")
        return self.work_dir / record.machine_id / f"{safe}.log"

    async def spawn(self, record: TaskRecord) -> ProcessHandle:
        """Start the task's command in a new session; raises OSError if it cannot start."""
        plan = record.plan
        runtime = plan.runtime
        assert isinstance(runtime, ProcessPlan)
        env = {
            **self.base_env,
            **dict(runtime.env),
            "CELLPILOT_TASK_JOB_ID": plan.job_id,
            "CELLPILOT_TASK_INDEX": str(plan.task_index),
            "CELLPILOT_TASK_INCARNATION": str(plan.incarnation),
            "CELLPILOT_TASK_PORTS": ",".join(str(p) for p in plan.ports),
            "CELLPILOT_MACHINE_ID": record.machine_id,
        }
        path = self.log_path(record)
        path.parent.mkdir(parents=True, exist_ok=True)
        log_file = open(path, "ab")  # noqa: SIM115, ASYNC230 - closed when the process exits
        try:
            process = await asyncio.create_subprocess_exec(
                runtime.command,
                *runtime.args,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log_file,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError:
            log_file.close()
            raise
        handle = ProcessHandle(process=process, pid=process.pid, log_file=log_file)
        if self.cgroup is not None:
            handle.cgroup = self.cgroup.attach(plan.name, process.pid, plan.limits.cpu_millicores)
        handle.last_cpu_seconds = self._cpu_seconds(handle)[0]
        return handle

    def meter(self, handle: ProcessHandle) -> None:
        """Refresh the handle's CPU rate, resident memory and throttling from the process tree."""
        now = time.monotonic()
        cpu_seconds, rss = self._cpu_seconds(handle)
        elapsed = now - handle.last_wall
        if elapsed > 0:
            handle.cpu_millicores = max(0.0, cpu_seconds - handle.last_cpu_seconds) / elapsed * 1000.0
        handle.last_cpu_seconds = cpu_seconds
        handle.last_wall = now
        handle.memory_bytes = rss
        if handle.cgroup is not None:
            periods = CgroupCpu.throttled_periods(handle.cgroup)
            handle.kernel_throttled = periods > handle.last_throttled_periods
            handle.last_throttled_periods = periods

    @staticmethod
    def _cpu_seconds(handle: ProcessHandle) -> tuple[float, int]:
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

    def update_limit(self, handle: ProcessHandle, cpu_limit_millicores: int) -> None:
        if self.cgroup is not None and handle.cgroup is not None:
            try:
                self.cgroup.set_limit(handle.cgroup, cpu_limit_millicores)
            except OSError as error:
                log.warning("could not update cpu.max", extra={"error": str(error)})

    @staticmethod
    def signal(handle: ProcessHandle, sig: signal.Signals) -> None:
        """Signal the task's whole process group."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(handle.pid, sig)

    async def wait(self, handle: ProcessHandle) -> int:
        """Wait for the task's process to exit; kill what is left of its group; clean up."""
        code = await handle.process.wait()
        self.signal(handle, signal.SIGKILL)
        handle.log_file.close()
        if handle.cgroup is not None:
            CgroupCpu.release(handle.cgroup)
        handle.exited.set()
        return int(code)
