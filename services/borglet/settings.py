"""The Borglet's one settings class (environment prefix ``CELLPILOT_BORGLET_``).

Built once in ``__main__`` and passed down. Lists (machine ids, Borgmaster addresses) are
comma-separated in the environment; attributes are ``key=value`` pairs, comma-separated.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from cellpilot.platform.settings import AddressList, ServiceSettings
from cellpilot.units import GIB
from cellpilot_services.borglet.task_sandbox import MINIMAL_PATH


class BorgletSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="CELLPILOT_BORGLET_", extra="ignore")
    service_name = "borglet"

    # Where the gRPC server listens, and the host the Borgmaster is told to call back on.
    listen_address: str = "127.0.0.1:0"
    advertise_host: str = "127.0.0.1"

    # The machines this process hosts: explicit ids, or fleet_size generated ones named
    # "<machine_id_prefix>-r<replica>-<i>". One process per machine is fleet_size = 1.
    machine_ids: AddressList = Field(default_factory=list)
    fleet_size: int = Field(default=1, ge=1)
    machine_id_prefix: str = "machine"
    # Capacity of every hosted machine (Resources units: millicores, bytes, bytes, ports).
    cpu_millicores: int = Field(default=32_000, gt=0)
    memory_bytes: int = Field(default=128 * GIB, gt=0)
    disk_bytes: int = Field(default=2_000 * GIB, ge=0)
    ports: int = Field(default=1_000, ge=0)
    first_port: int = Field(default=20_000, ge=1, le=65_535)
    attributes: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=lambda: {"arch": "x86_64", "os": "linux"}
    )
    machines_per_rack: int = Field(default=40, ge=1)
    racks_per_power_domain: int = Field(default=5, ge=1)

    # The Borgmaster replicas to register with (any order; writes follow "cellpilot-leader").
    # Empty: run standalone, driven by whoever calls the Borglet API.
    borgmaster_addresses: AddressList = Field(default_factory=list)
    # The service identity this process presents (its certificate, or its service token in
    # plaintext-dev); it names the machines it may report for. Empty: "borglet-r<replica>",
    # whose certificate covers "machine-r<replica>-*" (cellpilot certs issue).
    identity: str = ""
    register_backoff_initial_s: float = Field(default=0.2, gt=0)
    register_backoff_max_s: float = Field(default=5.0, gt=0)
    # How often (wall seconds) the view of each hosted job's load balancer is re-read from the
    # Borgmaster: which of the job's tasks share its demand (Borg §2.6).
    load_balancer_refresh_s: float = Field(default=1.0, gt=0)

    # Event time: simulated seconds per wall second, and the event time the clock starts at
    # (ms since epoch; unset = the wall clock at start).
    speedup: float = Field(default=1.0, gt=0)
    event_start_ms: int | None = None
    # Where the clock keeps how far it went (written every clock_save_interval_s wall seconds),
    # so a restart resumes after it and event time never goes backwards; "" = nowhere (each
    # start begins at event_start_ms or the wall clock). `cellpilot run` puts it in its data dir.
    clock_file: str = ""
    clock_save_interval_s: float = Field(default=1.0, gt=0)

    # Usage samples on Kafka usage.samples, batched per machine every publish interval (wall).
    publish_samples: bool = True
    publish_interval_s: float = Field(default=1.0, gt=0)
    max_samples_per_batch: int = Field(default=20_000, ge=1)
    max_buffered_samples: int = Field(default=5_000_000, ge=1)

    # Limit enforcement: a machine is short of memory above this fraction of its capacity.
    memory_pressure_fraction: float = Field(default=0.95, gt=0, le=1)
    # Events kept per machine until the master acknowledges them (oldest dropped beyond).
    max_unacked_events: int = Field(default=10_000, ge=1)

    # Runtime defaults: for tasks whose spec names no runtime.
    default_runtime: Literal["simulated", "process"] = "simulated"
    default_usage_model: str = "steady"
    # Process runtime: where task working directories and logs go, how often processes are
    # metered (wall seconds), and the cgroup v2 directory to create task cgroups under ("" = the
    # Borglet's own cgroup, found through /proc/self; "none" = never use cgroups: the Borglet's
    # metering enforces limits).
    allow_process_runtime: bool = True
    work_dir: str = ""
    meter_interval_s: float = Field(default=1.0, gt=0)
    cgroup_root: str = ""
    # The account process tasks run as when the Borglet is root ("" = the system user
    # cellpilot-task, created on first use). A Borglet that is not root runs them as itself.
    task_user: str = ""
    # Variables every task process starts with (under the spec's own; nothing else is inherited
    # from the Borglet's environment, HOME is the task's working directory).
    task_base_env: dict[str, str] = Field(default_factory=lambda: {"PATH": MINIMAL_PATH})
    # Kill the tasks this process started when it shuts down (no orphans on a laptop).
    kill_tasks_on_exit: bool = True

    @field_validator("attributes", mode="before")
    @classmethod
    def _split_attributes(cls, value: object) -> object:
        if isinstance(value, str):
            pairs = [item.split("=", 1) for item in value.split(",") if item.strip()]
            if any(len(pair) != 2 for pair in pairs):
                raise ValueError("attributes must be key=value pairs separated by commas")
            return {key.strip(): val.strip() for key, val in pairs}
        return value

    def resolved_identity(self) -> str:
        return self.identity or f"borglet-r{self.replica_index}"

    def stream_identity(self) -> str:
        return self.resolved_identity()

    def resolved_machine_ids(self) -> list[str]:
        if self.machine_ids:
            return list(self.machine_ids)
        return [f"{self.machine_id_prefix}-r{self.replica_index}-{i:04d}" for i in range(self.fleet_size)]
