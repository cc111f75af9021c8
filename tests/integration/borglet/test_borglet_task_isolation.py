"""Process tasks isolated from the machine and limited by the kernel where the host allows it
(Borg §6.1 security isolation, §6.2 performance isolation): real processes, driven through the
Borglet's gRPC API as the Borgmaster would.

The kernel tests need a host that delegates a cgroup v2 subtree with the cpu and memory
controllers to the test process; elsewhere they are skipped, naming what is missing (``-ra``
prints it). A directory laid out like a delegated cgroup stands in for the kernel in the last
test, so the Borglet's side of it (placement, limits, readings, OOM reports) runs everywhere.
"""

from __future__ import annotations

import itertools
import logging
import os
import pwd
import re
import shutil
import signal
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from borglet_builders import (
    MIB,
    BorgletFactory,
    collect_samples,
    command_task,
    eventually,
    poll,
    poll_until,
    process_task,
    task_in,
)

from cellpilot.api.v1 import borglet_pb2, job_pb2, resources_pb2, state_pb2
from cellpilot.borg.cgroup_v2 import parse_cpu_stat
from cellpilot.borglet.hosted_task import HostedTask
from cellpilot.stack import StackEndpoints
from cellpilot_services.borglet import convert
from cellpilot_services.borglet.borglet_service import LIMIT_ENFORCEMENT_ATTRIBUTE, Borglet
from cellpilot_services.borglet.task_sandbox import DEFAULT_TASK_USER, MINIMAL_PATH

RUNNING, DEAD = state_pb2.TASK_STATE_RUNNING, state_pb2.TASK_STATE_DEAD
OOM, FAILED = state_pb2.TASK_EVENT_KIND_OOM, state_pb2.TASK_EVENT_KIND_FAILED
HOLD = ("--then", "hold")

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason=f"the tests run as uid {os.geteuid()}, not root: tasks run as that same user"
)


def _status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {key: value.strip() for key, _, value in (line.partition(":") for line in lines)}


def _environ(pid: int) -> dict[str, str]:
    entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(entry.decode().split("=", 1) for entry in entries if entry)


async def _started(
    borglet: Borglet, stub: object, task: borglet_pb2.TaskAssignment, marker: str
) -> HostedTask:
    """Start ``task`` and wait until the launcher has become its command (``marker`` in its argv)."""
    machine = borglet.profiles[0].machine_id
    reply = await stub.StartTask(  # type: ignore[attr-defined]
        borglet_pb2.StartTaskRequest(master_epoch=1, machine_id=machine, task=task)
    )
    assert reply.task.state == RUNNING
    record = borglet.machines[0].tasks[(task.job_id, task.task_index)]
    pid = record.process.pid

    async def exec_done() -> bool:
        return marker in " ".join(psutil.Process(pid).cmdline())

    await eventually(exec_done, timeout_s=10)
    return record


# ----- least privilege -------------------------------------------------------------------------------


@needs_root
async def test_a_process_task_runs_as_the_configured_unprivileged_user(
    borglet_factory: BorgletFactory,
) -> None:
    nobody = pwd.getpwnam("nobody")
    async with borglet_factory(task_user="nobody", publish_samples=False) as (borglet, stub):
        task = process_task("iso/web", "120s:10MiB:0", 0, extra_args=HOLD)
        record = await _started(borglet, stub, task, "workload_program")
        pid = record.process.pid
        status = _status(pid)
        assert status["Uid"].split() == [str(nobody.pw_uid)] * 4  # real, effective, saved, filesystem
        assert status["Gid"].split() == [str(nobody.pw_gid)] * 4
        # Root's supplementary groups are not kept: only the account's own.
        assert {int(g) for g in status["Groups"].split()} == set(os.getgrouplist("nobody", nobody.pw_gid))
        # Its own working directory, owned by it and private to it, is its cwd and HOME.
        working_dir = borglet.runner.working_dir(record)
        assert psutil.Process(pid).cwd() == str(working_dir)
        info = working_dir.stat()
        assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (nobody.pw_uid, 0o700)
        # Nothing inherited but stdin, stdout and stderr; its own session and process group.
        assert sorted(os.listdir(f"/proc/{pid}/fd")) == ["0", "1", "2"]
        assert os.getsid(pid) == pid
        assert os.getpgid(pid) == pid
    assert not working_dir.exists()  # removed once the task ended


@needs_root
async def test_a_root_borglet_runs_tasks_as_its_dedicated_user_by_default(
    borglet_factory: BorgletFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="cellpilot_services.borglet")
    async with borglet_factory(publish_samples=False) as (borglet, stub):
        account = pwd.getpwnam(DEFAULT_TASK_USER)  # created on first use
        assert account.pw_uid != 0
        record = await _started(
            borglet, stub, process_task("iso/d", "120s:10MiB:0", 0, extra_args=HOLD), "workload"
        )
        assert psutil.Process(record.process.pid).uids() == (account.pw_uid,) * 3
    assert any(
        f"process tasks run as the system user {DEFAULT_TASK_USER}" in r.getMessage() for r in caplog.records
    )


@pytest.fixture
def root_only_file() -> Iterator[tuple[Path, Path]]:
    """A file only root may read and one anyone may, in a directory anyone can reach."""
    directory = Path(tempfile.mkdtemp(prefix="cellpilot-isolation-"))
    directory.chmod(0o755)  # reachable by anyone: only the files' own modes decide
    secret, public = directory / "secret", directory / "public"
    secret.write_text("root only")
    secret.chmod(0o600)
    public.write_text("for everyone")
    public.chmod(0o644)
    yield secret, public
    shutil.rmtree(directory)


@needs_root
async def test_a_process_task_cannot_read_a_file_only_root_may_read(
    borglet_factory: BorgletFactory, root_only_file: tuple[Path, Path]
) -> None:
    secret, public = root_only_file
    script = "import sys; print(open(sys.argv[1]).read(), flush=True); print(open(sys.argv[2]).read())"
    async with borglet_factory(publish_samples=False) as (borglet, stub):
        machine = borglet.profiles[0].machine_id
        task = command_task("iso/reader", [sys.executable, "-c", script, str(public), str(secret)])
        await stub.StartTask(borglet_pb2.StartTaskRequest(master_epoch=1, machine_id=machine, task=task))
        record = borglet.machines[0].tasks[("iso/reader", 0)]
        report = await poll_until(stub, machine, lambda r: task_in(r, "iso/reader").state == DEAD)
        reported = task_in(report, "iso/reader")
        assert (reported.exit_reason, reported.exit_code) == (FAILED, 1)
        log = borglet.runner.log_path(record).read_text()
    assert "for everyone" in log  # it ran, and read what it may
    assert "PermissionError" in log
    assert "root only" not in log


async def test_a_process_task_environment_holds_only_what_was_given(
    borglet_factory: BorgletFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CELLPILOT_TEST_BORGLET_SECRET", "not for tasks")
    async with borglet_factory(publish_samples=False) as (borglet, stub):
        task = process_task("iso/env", "120s:10MiB:0", 0, extra_args=HOLD, env={"GREETING": "hello"})
        record = await _started(borglet, stub, task, "workload_program")
        env = _environ(record.process.pid)
    home = env.pop("HOME")
    assert env == {
        "GREETING": "hello",
        "PATH": MINIMAL_PATH,
        "CELLPILOT_TASK_JOB_ID": "iso/env",
        "CELLPILOT_TASK_INDEX": "0",
        "CELLPILOT_TASK_INCARNATION": "1",
        "CELLPILOT_TASK_PORTS": "",
        "CELLPILOT_MACHINE_ID": borglet.profiles[0].machine_id,
    }
    assert home == str(borglet.runner.working_dir(record))  # its own directory, not the Borglet's HOME


# ----- who enforces limits -----------------------------------------------------------------------------


async def test_the_borglet_says_who_enforces_limits_on_this_host(
    borglet_factory: BorgletFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="cellpilot_services.borglet")
    async with borglet_factory(cgroup_root="", publish_samples=False) as (borglet, _):
        decision = borglet.enforcement
        print(f"cgroup v2 on this host: {decision.mode}; missing: {list(decision.missing)}")
        spec = convert.machine_spec(borglet.profiles[0], borglet.address)
        assert spec.attributes[LIMIT_ENFORCEMENT_ATTRIBUTE] == decision.mode
        messages = [(r.levelno, r.getMessage()) for r in caplog.records]
        if decision.usable:
            assert borglet.cgroups is not None
            assert (
                logging.INFO,
                f"cgroup v2 enforcement under {borglet.cgroups.base}: {decision.enforced}",
            ) in (messages)
        else:
            warning = [text for level, text in messages if level == logging.WARNING and "cgroup v2" in text]
            assert len(warning) == 1
            for reason in decision.missing:
                assert reason in warning[0]
            assert "Enforced instead: memory: the Borglet's metering OOM-kills" in warning[0]
    caplog.clear()
    async with borglet_factory(cgroup_root="none", publish_samples=False) as (borglet, _):
        assert borglet.profiles[0].attributes[LIMIT_ENFORCEMENT_ATTRIBUTE] == "borglet-metering"
        assert any(
            r.levelno == logging.WARNING
            and "cgroups are turned off (CELLPILOT_BORGLET_CGROUP_ROOT=none)" in r.getMessage()
            for r in caplog.records
        )


async def _kernel_borglet_or_skip(borglet: Borglet) -> None:
    if borglet.cgroups is None:
        pytest.skip(
            f"cgroup v2 enforcement is not usable on this host: {'; '.join(borglet.enforcement.missing)}"
        )


async def test_the_kernel_oom_kills_a_task_over_memory_max_and_it_is_reported(
    borglet_factory: BorgletFactory,
) -> None:
    async with borglet_factory(cgroup_root="", memory_bytes=4 << 30, publish_samples=False) as (
        borglet,
        stub,
    ):
        await _kernel_borglet_or_skip(borglet)
        machine = borglet.profiles[0].machine_id
        limit = 100 * MIB
        task = process_task(
            "k/leaky", "1s:20MiB:0,60s:400MiB:0", limit, hard=True, extra_args=("--grow-rate", "1GiB")
        )
        record = await _started(borglet, stub, task, "workload_program")
        cgroup = record.process.cgroup
        assert cgroup is not None
        assert (cgroup / "memory.max").read_text().strip() == str(limit)
        assert str(record.process.pid) in (cgroup / "cgroup.procs").read_text().split()
        report = await poll_until(stub, machine, lambda r: task_in(r, "k/leaky").state == DEAD)
        assert task_in(report, "k/leaky").exit_reason == OOM
        oom = [e.event for e in report.events if e.event.kind == OOM]
        assert len(oom) == 1
        assert f"killed by the kernel at memory.max {limit} B" in oom[0].detail
        kills = re.search(r"memory\.events oom_kill (\d+)", oom[0].detail)
        assert kills is not None
        assert int(kills.group(1)) >= 1
        assert not cgroup.exists()  # removed when the task ended


async def test_cpu_max_throttles_a_busy_task_and_its_samples_say_so(
    borglet_factory: BorgletFactory, endpoints: StackEndpoints
) -> None:
    async with borglet_factory(cgroup_root="", memory_bytes=4 << 30) as (borglet, stub):
        await _kernel_borglet_or_skip(borglet)
        machine = borglet.profiles[0].machine_id
        task = process_task("k/busy", "120s:10MiB:1000m", 0, cpu_limit=200, extra_args=HOLD)
        record = await _started(borglet, stub, task, "workload_program")
        cgroup = record.process.cgroup
        assert cgroup is not None
        assert (cgroup / "cpu.max").read_text().split() == ["20000", "100000"]
        records = await collect_samples(endpoints.kafka_bootstrap, {machine}, enough=6)
        samples = [s for _, batch in records for s in batch.samples if s.job_id == "k/busy"]
        assert parse_cpu_stat((cgroup / "cpu.stat").read_text()).nr_throttled > 0
        assert any(s.cpu_throttled for s in samples)
        assert sorted(s.cpu_millicores for s in samples)[len(samples) // 2] < 350  # held near 200m
        # New limits are written in place (Borg §2.3), the task keeps running.
        await stub.UpdateTask(
            borglet_pb2.UpdateTaskRequest(
                master_epoch=1,
                machine_id=machine,
                job_id="k/busy",
                task_index=0,
                incarnation=1,
                limits=resources_pb2.Resources(cpu_millicores=500, memory_bytes=256 * MIB),
                memory_limit_kind=job_pb2.MEMORY_LIMIT_KIND_HARD,
            )
        )
        assert (cgroup / "cpu.max").read_text().split() == ["50000", "100000"]
        assert (cgroup / "memory.max").read_text().strip() == str(256 * MIB)
        assert task_in(await poll(stub, machine), "k/busy").state == RUNNING


# ----- the Borglet's side of cgroups, on a stand-in directory ---------------------------------------


async def test_a_delegated_cgroup_gets_the_task_its_limits_and_its_kernel_oom_report(
    borglet_factory: BorgletFactory, tmp_path: Path
) -> None:
    root = tmp_path / "delegated"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpu io memory pids\n")
    (root / "cgroup.subtree_control").write_text("")
    async with borglet_factory(cgroup_root=str(root), publish_samples=False) as (borglet, stub):
        assert borglet.cgroups is not None
        assert borglet.profiles[0].attributes[LIMIT_ENFORCEMENT_ATTRIBUTE] == "cgroup-v2"
        machine = borglet.profiles[0].machine_id
        limit = 100 * MIB
        task = process_task("fake/web", "120s:10MiB:0", limit, cpu_limit=250, extra_args=HOLD)
        record = await _started(borglet, stub, task, "workload_program")
        handle = record.process
        cgroup = handle.cgroup
        assert cgroup is not None
        assert cgroup.parent == borglet.cgroups.base
        # The launcher joined the cgroup itself, before it became the task's command.
        assert (cgroup / "cgroup.procs").read_text() == str(handle.pid)
        assert (cgroup / "memory.max").read_text() == str(limit)
        assert (cgroup / "cpu.max").read_text() == "25000 100000"
        assert (cgroup / "memory.oom.group").read_text() == "1"
        await stub.UpdateTask(
            borglet_pb2.UpdateTaskRequest(
                master_epoch=1,
                machine_id=machine,
                job_id="fake/web",
                task_index=0,
                incarnation=1,
                limits=resources_pb2.Resources(cpu_millicores=500, memory_bytes=limit),
                memory_limit_kind=job_pb2.MEMORY_LIMIT_KIND_SOFT,
            )
        )
        assert (cgroup / "cpu.max").read_text() == "50000 100000"
        assert (cgroup / "memory.max").read_text() == "max"  # a soft limit is the Borglet's to enforce
        # What the cgroup reads is what the Borglet reports: its memory and the kernel's throttling.
        (cgroup / "memory.current").write_text(f"{30 * MIB}\n")
        periods = itertools.count(1)

        def throttled_at_30_mib(response: borglet_pb2.PollResponse) -> bool:
            (cgroup / "cpu.stat").write_text(f"usage_usec 0\nnr_throttled {next(periods)}\n")
            reported = task_in(response, "fake/web")
            return reported.cpu_throttled and reported.usage.memory_bytes == 30 * MIB

        await poll_until(stub, machine, throttled_at_30_mib)
        # The kernel OOM-kills it at its limit: memory.events counts the kill, SIGKILL ends it.
        (cgroup / "memory.events").write_text("oom 1\noom_kill 1\n")
        (cgroup / "memory.peak").write_text(f"{limit}\n")
        os.kill(handle.pid, signal.SIGKILL)
        report = await poll_until(stub, machine, lambda r: task_in(r, "fake/web").state == DEAD)
        assert task_in(report, "fake/web").exit_reason == OOM
        oom = [e.event for e in report.events if e.event.kind == OOM]
        assert len(oom) == 1
        assert "memory.events oom_kill 1" in oom[0].detail
        assert "killed by the kernel's OOM killer" in oom[0].detail  # its limit was soft by then
        assert oom[0].usage.memory_bytes == limit  # the peak, from memory.peak
