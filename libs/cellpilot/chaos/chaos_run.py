"""``cellpilot run`` as the chaos run drives it: detached, in its own data directory, on ports of its own.

Every service ``cellpilot run`` starts listens on fixed ports by default (Borgmaster 7100-7102,
...). A chaos run moves them all to a block of free ports through the services' own settings
(``CELLPILOT_<SERVICE>_BASE_PORT``, the Borgmaster addresses each client is given, metrics on
any free port), so it never meets a ``make run`` or another test on the same machine. The
dashboard is not started: nothing here reads it.

Processes are found the way ``cellpilot stack status`` finds them (the supervisor's state
file) and killed with SIGKILL; the supervisor notices and starts them again.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from cellpilot.stack import StackConfig, StackEndpoints
from cellpilot.stack.config import free_port, port_in_use
from cellpilot.stack.supervision import stack_status
from cellpilot.stack.supervision_state import UnitStatus

RUN_SERVICES = ("borgmaster", "scheduler", "borglet", "aggregator", "recommender", "autopilot", "actuator")
# gRPC ports of the moved services, from the block's first port: name -> (offset, replicas).
PORT_LAYOUT = {
    "borgmaster": (0, 3),
    "aggregator": (3, 2),
    "recommender": (5, 3),
    "autopilot": (8, 2),
    "actuator": (10, 1),
    "scheduler": (11, 1),
}
BLOCK = 12
STOP_TIMEOUT_S = 90.0
START_TIMEOUT_S = 300.0


def free_port_block(size: int = BLOCK, host: str = "127.0.0.1") -> int:
    """A first port such that it and the ``size - 1`` after it are all free now."""
    for _ in range(200):
        first = free_port(host)
        if first + size <= 65_000 and not any(port_in_use(host, first + i) for i in range(size)):
            return first
    raise RuntimeError(f"no {size} consecutive free ports")


@dataclass(frozen=True)
class ServicePorts:
    """Where each moved service listens: a block of consecutive ports from ``first``."""

    first: int

    def addresses(self, service: str) -> list[str]:
        offset, replicas = PORT_LAYOUT[service]
        return [f"127.0.0.1:{self.first + offset + i}" for i in range(replicas)]

    def env(self) -> dict[str, str]:
        borgmasters = ",".join(self.addresses("borgmaster"))
        env = {
            f"CELLPILOT_{name.upper()}_BASE_PORT": str(self.first + offset)
            for name, (offset, _) in PORT_LAYOUT.items()
        }
        for name in ("borgmaster", "scheduler", "aggregator", "recommender", "autopilot", "actuator"):
            env[f"CELLPILOT_{name.upper()}_METRICS_PORT"] = "0"  # any free port
        for client in ("borglet", "scheduler", "autopilot", "actuator"):
            env[f"CELLPILOT_{client.upper()}_BORGMASTER_ADDRESSES"] = borgmasters
        return env


class ChaosRun:
    """One detached ``cellpilot run`` of the chaos run, and the faults done to its processes."""

    def __init__(self, data_dir: Path, ports: ServicePorts, extra_env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.ports = ports
        # The run is self-contained: no CELLPILOT_ setting of the caller's shell or test session.
        clean = {k: v for k, v in os.environ.items() if not k.startswith("CELLPILOT_")}
        self.env = {**clean, **ports.env(), **(extra_env or {})}
        self.endpoints: StackEndpoints | None = None

    @property
    def env_path(self) -> Path:
        return self.data_dir / "stack.env"

    @property
    def logs(self) -> Path:
        return self.data_dir / "logs"

    async def _cellpilot(self, *args: str, timeout_s: float) -> tuple[int, str]:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "cellpilot.cli.main",
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=self.env,
        )
        try:
            output, _ = await asyncio.wait_for(process.communicate(), timeout_s)
        except TimeoutError:
            process.kill()
            await process.wait()
            return -1, f"cellpilot {args[0]} did not finish within {timeout_s:.0f} s"
        return int(process.returncode or 0), output.decode(errors="replace")

    async def start(self) -> StackEndpoints:
        """``cellpilot run --detach`` (no demo: the chaos run submits it); returns once all is up."""
        services = [f"--service={name}" for name in RUN_SERVICES]
        code, output = await self._cellpilot(
            "run",
            "--data-dir",
            str(self.data_dir),
            "--detach",
            "--no-demo",
            *services,
            timeout_s=START_TIMEOUT_S,
        )
        if code != 0:
            raise RuntimeError(f"cellpilot run did not start:\n{output[-3000:]}")
        # The chaos run inspects every store as the stack's administrator (the operating-system
        # account that runs it): the services' own roles each see only their part.
        self.endpoints = StackConfig(self.data_dir).with_ports_resolved().admin_endpoints()
        return self.endpoints

    async def stop(self) -> str:
        code, output = await self._cellpilot(
            "stop", "--data-dir", str(self.data_dir), timeout_s=STOP_TIMEOUT_S
        )
        return output.strip().splitlines()[-1] if output.strip() else f"exit code {code}"

    # -- processes ---------------------------------------------------------------------
    def unit(self, name: str, replica: int = 0) -> UnitStatus:
        for unit in stack_status(self.data_dir).units:
            if (unit.name, unit.replica) == (name, replica):
                return unit
        raise LookupError(f"{name}[{replica}] is not part of the run")

    def kill(self, name: str, replica: int = 0) -> int:
        """SIGKILL the unit now (a component's whole process group: PostgreSQL with its backends)."""
        unit = self.unit(name, replica)
        if unit.pid is None or unit.state != "running":
            raise RuntimeError(f"{name}[{replica}] is not running ({unit.state})")
        if unit.kind == "component":
            os.killpg(unit.pid, signal.SIGKILL)
        else:
            os.kill(unit.pid, signal.SIGKILL)
        return unit.pid

    async def wait_restarted(self, name: str, replica: int, old_pid: int, limit_s: float) -> float | None:
        """Seconds until the supervisor has the unit running again under a new pid (None: not in time)."""
        began = time.monotonic()
        while time.monotonic() - began < limit_s:
            unit = await asyncio.to_thread(self.unit, name, replica)
            if unit.state == "running" and unit.pid not in (None, old_pid):
                return time.monotonic() - began
            await asyncio.sleep(0.2)
        return None
