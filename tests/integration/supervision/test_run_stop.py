"""Stopping a foreground ``cellpilot run`` (``cellpilot stop`` from elsewhere, or Ctrl-C): everything
is gone within the two grace periods (the services', then the stores', each given to all at
once, not one after another), ``cellpilot run`` exits 0 saying so, and no process, zombie or
port is left."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from run_command import (
    cellpilot,
    exists_even_as_zombie,
    start_foreground_run,
    status,
    three_free_ports,
    wait_for,
)

from cellpilot.stack.config import port_in_use
from cellpilot.stack.services import STOP_GRACE_S as SERVICES_GRACE_S
from cellpilot.stack.supervision_state import SupervisorState
from cellpilot.stack.supervisor import STOP_GRACE_S as STORES_GRACE_S

pytestmark = pytest.mark.slow  # started first (tests/conftest.py)

# The services all at once (SIGKILL after their grace), then the stores all at once; plus a few
# seconds for port release and a loaded machine. Serial stops (a grace per component) take 30 s+.
STOP_BUDGET_S = SERVICES_GRACE_S + STORES_GRACE_S + 5.0


@dataclass(frozen=True)
class RunningStack:
    run: subprocess.Popen[bytes]
    output: Path
    data_dir: Path
    pids: frozenset[int]  # every process of the stack: the components, the replicas, their children
    ports: frozenset[int]


def start_and_wait_until_up(tmp_path: Path) -> RunningStack:
    data_dir = tmp_path / "stack"
    output = tmp_path / "run.out"
    base_port = three_free_ports()
    run = start_foreground_run(data_dir, base_port, output)

    def everything_listening() -> SupervisorState | None:
        assert run.poll() is None, output.read_text()
        state = SupervisorState.load(data_dir)
        if state is None or state.phase != "running" or len(state.units) != 6:
            return None
        if not all(unit.state == "running" and unit.ports for unit in state.units):
            return None
        # A replica's /metrics port may listen before its gRPC port: wait for the gRPC ones.
        listening = {port for unit in state.units for port in unit.ports}
        return state if {base_port, base_port + 1, base_port + 2} <= listening else None

    state = wait_for(everything_listening, 120, "cellpilot run to start everything")
    assert isinstance(state, SupervisorState)
    pids = {int(unit.pid) for unit in state.units if unit.pid is not None}
    for pid in list(pids):
        pids |= {child.pid for child in psutil.Process(pid).children(recursive=True)}
    ports = {port for unit in state.units for port in unit.ports}
    assert {base_port, base_port + 1, base_port + 2} <= ports
    return RunningStack(run, output, data_dir, frozenset(pids), frozenset(ports))


def assert_everything_gone(stack: RunningStack, stopped_in_s: float) -> None:
    assert stopped_in_s <= STOP_BUDGET_S, f"stopping took {stopped_in_s:.1f} s"
    output = stack.output.read_text()
    assert stack.run.returncode == 0, output
    assert "Cellpilot stopped" in output
    left = [pid for pid in stack.pids if exists_even_as_zombie(pid)]
    assert not left, f"processes (or zombies) of the stack left: {left}"
    held = [port for port in stack.ports if port_in_use("127.0.0.1", port)]
    assert not held, f"ports still held: {held}"
    code, document = status(stack.data_dir)
    assert code == 1
    assert document["supervisor"] is None


def stop_with(stack: RunningStack, request_stop: Callable[[], None]) -> float:
    began = time.monotonic()
    request_stop()
    try:
        stack.run.wait(timeout=60)
    except subprocess.TimeoutExpired:
        stack.run.kill()
        stack.run.wait()
        pytest.fail(f"cellpilot run did not exit: {stack.output.read_text()}")
    stopped_in = time.monotonic() - began
    print(f"stop took {stopped_in:.2f} s")
    return stopped_in


def test_cellpilot_stop_ends_a_foreground_run_and_everything_it_started(tmp_path: Path) -> None:
    stack = start_and_wait_until_up(tmp_path)

    def cellpilot_stop() -> None:
        stopped = cellpilot("stop", "--data-dir", str(stack.data_dir), timeout=60)
        assert stopped.returncode == 0, stopped.stderr

    stopped_in = stop_with(stack, cellpilot_stop)
    assert_everything_gone(stack, stopped_in)


def test_ctrl_c_ends_a_foreground_run_and_everything_it_started(tmp_path: Path) -> None:
    stack = start_and_wait_until_up(tmp_path)
    # A terminal's Ctrl-C: SIGINT to the foreground process group (the services have their own).
    stopped_in = stop_with(stack, lambda: os.killpg(stack.run.pid, signal.SIGINT))
    assert_everything_gone(stack, stopped_in)
    assert "Ctrl-C" in stack.output.read_text()


def test_cellpilot_stop_stops_everything_itself_when_cellpilot_run_is_gone(tmp_path: Path) -> None:
    stack = start_and_wait_until_up(tmp_path)
    stack.run.kill()  # the supervisor dies without stopping anything
    stack.run.wait()
    began = time.monotonic()
    stopped = cellpilot("stop", "--data-dir", str(stack.data_dir), timeout=60)
    stopped_in = time.monotonic() - began
    assert stopped.returncode == 0, stopped.stderr
    assert stopped_in <= STOP_BUDGET_S, f"stopping took {stopped_in:.1f} s"
    # The orphans were reparented to init, which reaps them in its own time.
    wait_for(
        lambda: not any(exists_even_as_zombie(pid) for pid in stack.pids), 10, "the orphans to be reaped"
    )
    held = [port for port in stack.ports if port_in_use("127.0.0.1", port)]
    assert not held, f"ports still held: {held}"
