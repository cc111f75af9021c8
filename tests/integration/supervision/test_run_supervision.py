"""``cellpilot run --detach`` keeps every process running: what dies is restarted, a crash loop is
given up on, and ``cellpilot stack status`` shows all of it.

One detached run (three Borgmaster replicas, the embedded stack) serves the module. Replica 2's
port is taken by the test before the run starts, so that replica dies at every start. The tests
poll the status in-process (the function behind ``stack status``) and check the command once.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from run_command import (
    cellpilot,
    exists_even_as_zombie,
    hold_port,
    run_args,
    run_env,
    status,
    three_free_ports,
    unit,
    unit_status,
    wait_for,
)

from cellpilot.platform.kafka import ensure_topics
from cellpilot.stack import StackEndpoints
from cellpilot.stack.config import port_in_use

MAX_RESTARTS = 2


@dataclass(frozen=True)
class DetachedRun:
    data_dir: Path
    base_port: int
    output: str  # what `cellpilot run --detach` printed


@pytest.fixture(scope="module")
def detached_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DetachedRun]:
    data_dir = tmp_path_factory.mktemp("run-detached")
    base_port = three_free_ports()
    held = hold_port(base_port + 2)
    try:
        started = cellpilot(
            *run_args(data_dir, "--detach", f"--max-restarts={MAX_RESTARTS}", "--restart-backoff=0.2"),
            env=run_env(base_port),
        )
        assert started.returncode == 0, started.stderr
        yield DetachedRun(data_dir, base_port, started.stderr)
    finally:
        stopped = cellpilot("stop", "--data-dir", str(data_dir), timeout=60)
        held.close()
        assert stopped.returncode == 0, stopped.stderr


def test_detach_returns_once_everything_is_up_under_a_background_supervisor(
    detached_run: DetachedRun,
) -> None:
    _, document = status(detached_run.data_dir)
    supervisor = document["supervisor"]
    assert isinstance(supervisor, dict)
    assert supervisor["phase"] == "running"
    command = psutil.Process(supervisor["pid"]).cmdline()
    assert "run" in command
    assert "--service=borgmaster" in command
    endpoints = StackEndpoints.read_env_file(detached_run.data_dir / "stack.env")
    for key, value in endpoints.as_env().items():
        assert f"{key}={value}" in detached_run.output, "it prints the stack the supervisor started"
    assert f"supervisor: cellpilot run pid {supervisor['pid']}" in detached_run.output


def test_a_killed_borgmaster_replica_is_restarted_and_shown_with_its_new_pid(
    detached_run: DetachedRun,
) -> None:
    before = unit_status(detached_run.data_dir, "borgmaster", 0)
    assert before.state == "running"
    assert before.pid is not None
    os.kill(before.pid, signal.SIGKILL)

    def restarted() -> bool:
        now = unit_status(detached_run.data_dir, "borgmaster", 0)
        return now.pid != before.pid and now.state == "running" and now.port == detached_run.base_port

    wait_for(restarted, 60, "borgmaster[0] to be restarted and listening")
    _, document = status(detached_run.data_dir)
    row = unit(document, "borgmaster", 0)
    assert row["pid"] != before.pid
    assert row["state"] == "running"
    assert row["restarts"] == 1
    assert row["last_exit"] == "killed by SIGKILL"
    assert psutil.Process(int(row["pid"])).cmdline()[-1] == "cellpilot_services.borgmaster"  # type: ignore[call-overload]
    assert not exists_even_as_zombie(before.pid), "the supervisor reaps the replica that died"
    log = (detached_run.data_dir / "logs" / "run.log").read_text()
    assert f"borgmaster[0] (pid {before.pid}) died: killed by SIGKILL" in log


def test_a_replica_that_keeps_dying_is_given_up_after_the_limit(detached_run: DetachedRun) -> None:
    wait_for(
        lambda: unit_status(detached_run.data_dir, "borgmaster", 2).state == "gave-up",
        90,
        "borgmaster[2] to be given up",
    )
    code, document = status(detached_run.data_dir)
    row = unit(document, "borgmaster", 2)
    assert row["state"] == "gave-up"
    assert row["restarts"] == MAX_RESTARTS
    assert row["last_exit"] == "exit code 1"
    assert not exists_even_as_zombie(int(row["pid"]))  # type: ignore[call-overload]
    assert code == 1, "a replica given up on means the stack is not healthy"
    assert document["healthy"] is False
    assert unit(document, "borgmaster", 1)["state"] == "running", "the others keep running"
    log = (detached_run.data_dir / "logs" / "run.log").read_text()
    assert f"restarted {MAX_RESTARTS} times in the last" in log
    assert "giving up" in log


def test_a_killed_broker_is_restarted_with_its_topics(detached_run: DetachedRun) -> None:
    before = unit_status(detached_run.data_dir, "kafka")
    assert before.pid is not None
    os.kill(before.pid, signal.SIGKILL)

    def restarted() -> bool:
        now = unit_status(detached_run.data_dir, "kafka")
        return now.pid != before.pid and now.state == "running"

    wait_for(restarted, 60, "the broker to be restarted")
    assert before.port is not None
    assert port_in_use("127.0.0.1", before.port)
    endpoints = StackEndpoints.read_env_file(detached_run.data_dir / "stack.env")
    created = asyncio.run(ensure_topics(endpoints.kafka_bootstrap))
    assert created == [], "the supervisor created every topic on the restarted (empty) broker"
    assert not exists_even_as_zombie(before.pid)
    assert unit_status(detached_run.data_dir, "kafka").last_exit == "killed by SIGKILL"
