"""The Cellpilot services ``cellpilot run`` starts on top of the embedded stack, as local processes.

Each entry is one deployed service (``python -m cellpilot_services.<module>``) with its
replica count; replica ``i`` gets ``CELLPILOT_REPLICA_INDEX=i`` and the stack's connection
settings through ``CELLPILOT_STACK_ENV``; ``{data_dir}`` and ``{replica}`` in an environment
value name the stack's data directory and the replica index. A spec's environment holds
defaults: a variable already set in ``cellpilot run``'s environment wins (so a run can be moved
to other ports, e.g. ``CELLPILOT_BORGLET_BORGMASTER_ADDRESSES`` with
``CELLPILOT_BORGMASTER_BASE_PORT``). Services register here as they are built.

Started by root, each service runs as its own account and reads only its own secrets
(:mod:`cellpilot.stack.service_accounts`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

import cellpilot
from cellpilot.platform.launch_as import start_as
from cellpilot.stack.processes import ProcessHandle, StopRequest, process_alive, stop_processes
from cellpilot.stack.service_accounts import account_of, reachable_by
from cellpilot.stack.supervision_state import write_json_atomically


@dataclass(frozen=True)
class ServiceSpec:
    name: str
    module: str
    replicas: int = 1
    env: dict[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()


SERVICES: tuple[ServiceSpec, ...] = (
    ServiceSpec("borgmaster", "borgmaster", 3),  # replicas on 127.0.0.1:7100-7102, one elected
    # Borg §3.4: the scheduler in a process of its own, proposing to the elected master (health 7700).
    ServiceSpec("scheduler", "scheduler", 1),
    ServiceSpec(
        "borglet",
        "borglet",
        1,
        {
            "CELLPILOT_BORGLET_FLEET_SIZE": "4",
            # Event time 60x the wall clock: a 5-minute window closes every 5 s (the demo).
            "CELLPILOT_BORGLET_SPEEDUP": "60",
            "CELLPILOT_BORGLET_BORGMASTER_ADDRESSES": "127.0.0.1:7100,127.0.0.1:7101,127.0.0.1:7102",
            # The sped-up event clock resumes where it stopped on the next `cellpilot run`.
            "CELLPILOT_BORGLET_CLOCK_FILE": "{data_dir}/borglet/clock-r{replica}.json",
        },
    ),
    ServiceSpec("aggregator", "aggregator", 2),  # Monitoring API on 127.0.0.1:7300-7301
    ServiceSpec("recommender", "recommender", 3),  # one consumer group; gRPC health 7500-7502
    ServiceSpec("autopilot", "autopilot", 2),  # 127.0.0.1:7400-7401, one holds the Redis lock
    ServiceSpec("actuator", "actuator", 1),  # gRPC health on 127.0.0.1:7600
    ServiceSpec("dashboard", "dashboard", 1),  # https://127.0.0.1:8080/ (sign in, or a bearer token)
)

# Services finish in-flight work on SIGTERM (cellpilot.platform.service); after this, SIGKILL.
STOP_GRACE_S = 5.0


@dataclass(frozen=True)
class RunningService:
    name: str
    replica: int
    pid: int


class ServiceSupervisor:
    """Starts and stops the service processes of one stack data directory.

    The processes it started itself are kept as handles (so they are reaped and their exit
    status is known); ``services.json`` in the data directory records every replica's pid, so
    another program (``cellpilot stop``, ``cellpilot stack status``) finds them.
    """

    def __init__(self, data_dir: Path, env_file: Path) -> None:
        self.data_dir = data_dir
        self.env_file = env_file
        self.state_path = data_dir / "services.json"
        self._specs = {spec.name: spec for spec in SERVICES}
        self._handles: dict[tuple[str, int], ProcessHandle] = {}

    def recorded(self) -> list[RunningService]:
        """Every replica in ``services.json``, running or not."""
        if not self.state_path.exists():
            return []
        return [RunningService(**entry) for entry in json.loads(self.state_path.read_text())]

    def running(self) -> list[RunningService]:
        return [service for service in self.recorded() if self._alive(service)]

    def _alive(self, service: RunningService) -> bool:
        """True if the recorded pid still runs this service (not a recycled pid of another program)."""
        spec = self._specs.get(service.name)
        module = f"cellpilot_services.{spec.module if spec else service.name}"
        try:
            process = psutil.Process(service.pid)
            return process_alive(process) and module in process.cmdline()
        except psutil.Error:
            return False

    def start(self, specs: tuple[ServiceSpec, ...] = SERVICES) -> list[RunningService]:
        self._specs.update({spec.name: spec for spec in specs})
        started = self.running()
        already = {(s.name, s.replica) for s in started}
        (self.data_dir / "logs").mkdir(parents=True, exist_ok=True)
        for spec in specs:
            for replica in range(spec.replicas):
                if (spec.name, replica) in already:
                    continue
                handle = self._spawn(spec, replica)
                started.append(RunningService(spec.name, replica, handle.pid))
                self._save(started)
        return started

    def restart(self, name: str, replica: int) -> ProcessHandle:
        """Start replica ``replica`` of service ``name`` again (its previous process is gone)."""
        handle = self._spawn(self._specs[name], replica)
        restarted = RunningService(name, replica, handle.pid)
        services = [s for s in self.recorded() if (s.name, s.replica) != (name, replica)]
        self._save(sorted([*services, restarted], key=self._order))
        return handle

    def _order(self, service: RunningService) -> tuple[int, int]:
        names = list(self._specs)
        return (names.index(service.name) if service.name in names else len(names), service.replica)

    def handle(self, name: str, replica: int) -> ProcessHandle | None:
        """The replica's process: the one started here, else the one ``services.json`` names."""
        if (name, replica) in self._handles:
            return self._handles[(name, replica)]
        for service in self.running():
            if (service.name, service.replica) == (name, replica):
                return ProcessHandle(service.pid)
        return None

    def _spawn(self, spec: ServiceSpec, replica: int) -> ProcessHandle:
        env = {
            **{k: v.format(data_dir=self.data_dir, replica=replica) for k, v in spec.env.items()},
            **os.environ,
            "CELLPILOT_STACK_ENV": str(self.env_file),
            "CELLPILOT_REPLICA_INDEX": str(replica),
        }
        log_path = self.data_dir / "logs" / f"{spec.name}-{replica}.log"
        account = account_of(spec.name)
        services_code = importlib.util.find_spec("cellpilot_services")
        python = Path(sys.executable)
        code = [python, python.resolve(), Path(cellpilot.__file__), Path.cwd() / "."]
        code += [Path(services_code.origin)] if services_code and services_code.origin else []
        reachable_by(account, [self.env_file, *code])
        with open(log_path, "ab") as log:
            process = start_as(
                [sys.executable, "-m", f"cellpilot_services.{spec.module}", *spec.args],
                env=env,
                uid=account.run_as.uid,
                gid=account.run_as.gid,
                groups=account.groups(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        handle = ProcessHandle.started(process)
        self._handles[(spec.name, replica)] = handle
        return handle

    def stop(self, grace_s: float = STOP_GRACE_S, log: Callable[[str], None] = lambda _: None) -> None:
        """SIGTERM every replica's process group at once, SIGKILL what is left after ``grace_s``."""
        requests = []
        for service in self.recorded():
            handle = self.handle(service.name, service.replica)
            if handle is not None and handle.pid == service.pid:
                requests.append(StopRequest(f"{service.name}[{service.replica}]", handle))
        stop_processes(requests, grace_s, log)
        self._save([])

    def _save(self, services: list[RunningService]) -> None:
        write_json_atomically(self.state_path, [s.__dict__ for s in services])
