"""``cellpilot run`` / ``stop`` / ``stack status`` as a user runs them, on ports of their own.

The tests run only the Borgmaster replicas (``--service borgmaster``, no demo) to stay fast; their
ports move to three free ones (``CELLPILOT_BORGMASTER_BASE_PORT``), so a ``make run`` on the same
machine is never touched. The embedded stack picks free ports in its fresh data directory.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from cellpilot.stack.config import BROKER_ENV, free_port, port_in_use
from cellpilot.stack.supervision import stack_status
from cellpilot.stack.supervision_state import UnitStatus

REPLICAS = 3


def three_free_ports() -> int:
    """A base port such that base, base + 1 and base + 2 are all free now."""
    for _ in range(100):
        base = free_port()
        if base + REPLICAS - 1 > 65_000:
            continue
        if not any(port_in_use("127.0.0.1", base + i) for i in range(REPLICAS)):
            return base
    raise RuntimeError("no three consecutive free ports")


def run_env(base_port: int) -> dict[str, str]:
    # The suite's own stack settings (its store URLs, certificates) must not leak into this run:
    # `cellpilot run` lets its environment override the services' defaults.
    # The broker choice stays the suite's (tests/integration/conftest.py: these tests reach the
    # broker anonymously, so the in-memory one unless the suite says otherwise).
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CELLPILOT_")}
    broker = {BROKER_ENV: os.environ.get(BROKER_ENV, "memory")}
    return {**clean, **broker, "CELLPILOT_BORGMASTER_BASE_PORT": str(base_port)}


def cellpilot(
    *args: str, env: dict[str, str] | None = None, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cellpilot.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def run_args(data_dir: Path, *extra: str) -> list[str]:
    return ["run", "--data-dir", str(data_dir), "--no-demo", "--service", "borgmaster", *extra]


def start_foreground_run(data_dir: Path, base_port: int, output: Path) -> subprocess.Popen[bytes]:
    """``cellpilot run`` in the foreground of its own session (as in a terminal of its own)."""
    with open(output, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "cellpilot.cli.main", *run_args(data_dir)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=run_env(base_port),
            start_new_session=True,
        )


def status(data_dir: Path) -> tuple[int, dict[str, object]]:
    """``cellpilot stack status --json``: its exit code and document."""
    result = cellpilot("stack", "status", "--data-dir", str(data_dir), "--json", timeout=60)
    assert result.stdout, result.stderr
    return result.returncode, json.loads(result.stdout)


def unit_status(data_dir: Path, name: str, replica: int = 0) -> UnitStatus:
    """One process as ``stack status`` sees it, read in-process (cheap enough to poll)."""
    return next(u for u in stack_status(data_dir).units if (u.name, u.replica) == (name, replica))


def unit(document: dict[str, object], name: str, replica: int = 0) -> dict[str, object]:
    units = document["units"]
    assert isinstance(units, list)
    return next(u for u in units if u["name"] == name and u["replica"] == replica)


def wait_for(check: Callable[[], object], timeout_s: float, what: str) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def exists_even_as_zombie(pid: int) -> bool:
    try:
        psutil.Process(pid).status()
        return True
    except psutil.NoSuchProcess:
        return False


def hold_port(port: int) -> socket.socket:
    """A plain listening socket on ``port``: a server started there fails to bind."""
    held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    held.bind(("127.0.0.1", port))
    held.listen()
    return held
