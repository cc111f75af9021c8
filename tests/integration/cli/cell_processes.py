"""A small real cell for CLI and dashboard tests: a Borgmaster and a Borglet fleet as processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from stack_security import client_options

from cellpilot.api.v1 import borgmaster_pb2, job_pb2, resources_pb2
from cellpilot.client import SyncCellpilotClient
from cellpilot.stack import StackEndpoints
from cellpilot.stack.config import free_port

GIB = 1 << 30
BORGMASTER_FAST = {
    "LEASE_S": "1.5",
    "RENEW_INTERVAL_S": "0.4",
    "ELECTION_INTERVAL_S": "0.25",
    "TAIL_INTERVAL_S": "0.1",
    "SCHEDULE_INTERVAL_S": "0.1",
    "POLL_INTERVAL_S": "0.3",
    "POLL_TIMEOUT_S": "0.5",
}


class Process:
    """``python -m cellpilot_services.<module>`` with its log in ``log_dir``."""

    def __init__(self, module: str, env: dict[str, str], log_dir: Path, endpoints: StackEndpoints) -> None:
        self.log_path = log_dir / f"{module}-{uuid.uuid4().hex[:6]}.log"
        full_env = {
            **os.environ,
            **endpoints.as_env(),
            "CELLPILOT_STACK_ENV": str(log_dir / "none.env"),
            "CELLPILOT_LOG_JSON": "false",
            **env,
        }
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", f"cellpilot_services.{module}"],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=full_env,
                start_new_session=True,
            )

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


@contextmanager
def running_cell(
    endpoints: StackEndpoints,
    database_url: str,
    log_dir: Path,
    machines: int = 3,
    borglet_env: dict[str, str] | None = None,
    borgmaster_env: dict[str, str] | None = None,
) -> Iterator[str]:
    """A Borgmaster replica, its scheduler (Borg §3.4) and a fleet of ``machines`` (4 cores, 8 GiB
    each); yields the Borgmaster's address."""
    port = free_port()
    address = f"127.0.0.1:{port}"
    borgmaster = Process(
        "borgmaster",
        {
            "CELLPILOT_POSTGRES_URL": database_url,
            "CELLPILOT_BORGMASTER_PORT": str(port),
            "CELLPILOT_BORGMASTER_METRICS_PORT": "0",
            "CELLPILOT_BORGMASTER_APPLY_MIGRATIONS": "false",
            "CELLPILOT_BORGMASTER_PUBLISH_EVENTS": "false",
            **{f"CELLPILOT_BORGMASTER_{k}": v for k, v in BORGMASTER_FAST.items()},
            **(borgmaster_env or {}),
        },
        log_dir,
        endpoints,
    )
    scheduler = Process(
        "scheduler",
        {
            "CELLPILOT_POSTGRES_URL": database_url,
            "CELLPILOT_SCHEDULER_PORT": "0",
            "CELLPILOT_SCHEDULER_METRICS_PORT": "0",
            "CELLPILOT_SCHEDULER_BORGMASTER_ADDRESSES": address,
            "CELLPILOT_SCHEDULER_TAIL_INTERVAL_S": "0.05",
            "CELLPILOT_SCHEDULER_SOFT_STATE_INTERVAL_S": "0.3",
            "CELLPILOT_SCHEDULER_FORCE_PASS_INTERVAL_S": "0.5",
            **(borgmaster_env or {}),  # the cell's scheduling policy is the Borgmaster's settings
        },
        log_dir,
        endpoints,
    )
    fleet = Process(
        "borglet",
        {
            "CELLPILOT_BORGLET_FLEET_SIZE": str(machines),
            "CELLPILOT_BORGLET_MACHINE_ID_PREFIX": f"cli-{uuid.uuid4().hex[:6]}",
            "CELLPILOT_BORGLET_BORGMASTER_ADDRESSES": address,
            "CELLPILOT_BORGLET_CPU_MILLICORES": "4000",
            "CELLPILOT_BORGLET_MEMORY_BYTES": str(8 * GIB),
            "CELLPILOT_BORGLET_PUBLISH_SAMPLES": "false",
            "CELLPILOT_BORGLET_CGROUP_ROOT": "none",
            **(borglet_env or {}),
        },
        log_dir,
        endpoints,
    )
    try:
        yield address
    finally:
        fleet.stop()
        scheduler.stop()
        borgmaster.stop()


def wait_for_machines(address: str, count: int, timeout_s: float = 30.0) -> None:
    with SyncCellpilotClient([address], **client_options()) as client:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if len(client.borgmaster.list_machines()) >= count:
                return
            time.sleep(0.2)
    raise AssertionError(f"fewer than {count} machines registered within {timeout_s} s")


def grant_quota(address: str, user: str) -> None:
    with SyncCellpilotClient([address], **client_options()) as client:  # quotas need the admin
        for band in (job_pb2.PRIORITY_BAND_PRODUCTION, job_pb2.PRIORITY_BAND_BATCH):
            client.borgmaster.set_quota(
                borgmaster_pb2.SetQuotaRequest(
                    user=user,
                    band=band,
                    limit=resources_pb2.Resources(
                        cpu_millicores=1_000_000, memory_bytes=1 << 42, disk_bytes=1 << 50, ports=10_000
                    ),
                )
            )
