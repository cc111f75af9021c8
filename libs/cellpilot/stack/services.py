"""The Cellpilot services ``cellpilot run`` starts on top of the embedded stack, as local processes.

Each entry is one deployed service (``python -m cellpilot_services.<module>``) with its
replica count; replica ``i`` gets ``CELLPILOT_REPLICA_INDEX=i`` and the stack's connection
settings through ``CELLPILOT_STACK_ENV``. Services register here as they are built.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import psutil


@dataclass(frozen=True)
class ServiceSpec:
    name: str
    module: str
    replicas: int = 1
    env: dict[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()


SERVICES: tuple[ServiceSpec, ...] = (
    ServiceSpec("borgmaster", "borgmaster", 3),  # replicas on 127.0.0.1:7100-7102, one elected
    ServiceSpec(
        "borglet",
        "borglet",
        1,
        {
            "CELLPILOT_BORGLET_FLEET_SIZE": "4",
            # Event time 60x the wall clock: a 5-minute window closes every 5 s (the demo).
            "CELLPILOT_BORGLET_SPEEDUP": "60",
            "CELLPILOT_BORGLET_BORGMASTER_ADDRESSES": "127.0.0.1:7100,127.0.0.1:7101,127.0.0.1:7102",
        },
    ),
    ServiceSpec("aggregator", "aggregator", 2),  # Monitoring API on 127.0.0.1:7300-7301
    ServiceSpec("recommender", "recommender", 3),  # one consumer group; gRPC health 7500-7502
    ServiceSpec("autopilot", "autopilot", 2),  # 127.0.0.1:7400-7401, one holds the Redis lock
    ServiceSpec("actuator", "actuator", 1),  # gRPC health on 127.0.0.1:7600
    ServiceSpec("dashboard", "dashboard", 1),  # https://127.0.0.1:8080/ (bearer token; /metrics, /docs)
)

STOP_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class RunningService:
    name: str
    replica: int
    pid: int


class ServiceSupervisor:
    """Starts and stops the service processes of one stack data directory."""

    def __init__(self, data_dir: Path, env_file: Path) -> None:
        self.data_dir = data_dir
        self.env_file = env_file
        self.state_path = data_dir / "services.json"

    def running(self) -> list[RunningService]:
        if not self.state_path.exists():
            return []
        entries = json.loads(self.state_path.read_text())
        return [RunningService(**entry) for entry in entries if psutil.pid_exists(entry["pid"])]

    def start(self, specs: tuple[ServiceSpec, ...] = SERVICES) -> list[RunningService]:
        started = self.running()
        already = {(s.name, s.replica) for s in started}
        (self.data_dir / "logs").mkdir(parents=True, exist_ok=True)
        for spec in specs:
            for replica in range(spec.replicas):
                if (spec.name, replica) in already:
                    continue
                env = {
                    **os.environ,
                    **spec.env,
                    "CELLPILOT_STACK_ENV": str(self.env_file),
                    "CELLPILOT_REPLICA_INDEX": str(replica),
                }
                log_path = self.data_dir / "logs" / f"{spec.name}-{replica}.log"
                with open(log_path, "ab") as log:
                    process = subprocess.Popen(
                        [sys.executable, "-m", f"cellpilot_services.{spec.module}", *spec.args],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                        env=env,
                    )
                started.append(RunningService(spec.name, replica, process.pid))
                self._save(started)
        return started

    def stop(self) -> None:
        processes = []
        for service in self.running():
            try:
                process = psutil.Process(service.pid)
                process.send_signal(signal.SIGTERM)
                processes.append(process)
            except psutil.NoSuchProcess:
                continue
        _, alive = psutil.wait_procs(processes, timeout=STOP_TIMEOUT_S)
        for process in alive:
            process.kill()
        psutil.wait_procs(alive, timeout=5)
        self._save([])

    def _save(self, services: list[RunningService]) -> None:
        self.state_path.write_text(json.dumps([s.__dict__ for s in services], indent=2) + "\n")
