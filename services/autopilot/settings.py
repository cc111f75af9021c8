"""The Autopilot master's one settings class (environment prefix ``CELLPILOT_AUTOPILOT_``).

Built once in ``__main__`` and passed down. Replica ``i`` serves the Autopilot API on
``base_port + i`` (7400, 7401 by default) unless ``port`` is set; its id is
``autopilot-<i>``.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from cellpilot.autopilot.selection import AutoMl
from cellpilot.platform.metrics import DEFAULT_METRICS_PORT_OFFSET
from cellpilot.platform.settings import PlatformSettings
from cellpilot.security.tls import SecuritySettings

GIB = 1 << 30


class AutopilotSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CELLPILOT_AUTOPILOT_", extra="ignore")

    platform: PlatformSettings = Field(default_factory=PlatformSettings)
    # mTLS certificates, token secret, request size limit (CELLPILOT_TLS_MODE, CELLPILOT_CERTS_DIR).
    security: SecuritySettings = Field(default_factory=SecuritySettings.load)

    replica_index: int = Field(
        default=0,
        ge=0,
        validation_alias=AliasChoices("CELLPILOT_AUTOPILOT_REPLICA_INDEX", "CELLPILOT_REPLICA_INDEX"),
    )
    replica_id: str = ""  # default "autopilot-<replica_index>"
    listen_host: str = "127.0.0.1"
    base_port: int = Field(default=7400, ge=1, le=65_000)
    port: int = Field(default=-1, ge=-1, le=65_535)  # -1: base_port + replica_index; 0: any free port
    # Prometheus /metrics: -1 = the gRPC port + 1000, 0 = any free port.
    metrics_port: int = Field(default=-1, ge=-1, le=65_535)
    advertise_host: str = "127.0.0.1"
    # The Borgmaster replicas (comma-separated in the environment); writes follow its master.
    borgmaster_addresses: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["127.0.0.1:7100", "127.0.0.1:7101", "127.0.0.1:7102"]
    )

    # Election (docs/architecture.md rule 7): a Redis lock whose every acquisition INCRs a fencing token.
    redis_prefix: str = "cellpilot:autopilot"
    lock_ttl_s: float = Field(default=3.0, gt=0)
    renew_interval_s: float = Field(default=1.0, gt=0)

    recommendations_topic: str = "recommendations"
    actuations_topic: str = "actuations"
    max_poll_records: int = Field(default=500, ge=1)

    # Held jobs (§3.1): released with their first recommendation, or after this long with
    # their own limits when no recommender has anything for them (no usage history yet).
    hold_grace_s: float = Field(default=30.0, ge=0)
    hold_scan_interval_s: float = Field(default=1.0, gt=0)

    # Decision policy (cellpilot.autopilot.decisions.DecisionPolicy).
    min_increase_fraction: float = Field(default=0.01, ge=0)
    min_decrease_fraction: float = Field(default=0.05, ge=0, lt=1)
    resend_after_s: float = Field(default=900.0, ge=0)  # event time
    machine_cpu_millicores: float | None = None  # the largest machine caps recommendations
    machine_memory_bytes: float | None = None
    # When AUTO picks ML over the §3.2.2 table (Autopilot §4.2): never / serving_memory / always.
    auto_ml: AutoMl = AutoMl.SERVING_MEMORY
    # What a "machine" is when sizing a job for the default OOM tolerance (§3.2.2).
    reference_machine_memory_bytes: float = Field(default=64.0 * GIB, gt=0)

    @field_validator("borgmaster_addresses", mode="before")
    @classmethod
    def _split_addresses(cls, value: object) -> object:
        if isinstance(value, str):
            return [item.strip() for item in value.split(",") if item.strip()]
        return value

    @property
    def resolved_replica_id(self) -> str:
        return self.replica_id or f"autopilot-{self.replica_index}"

    @property
    def resolved_port(self) -> int:
        return self.base_port + self.replica_index if self.port < 0 else self.port

    @property
    def resolved_metrics_port(self) -> int:
        if self.metrics_port >= 0:
            return self.metrics_port
        return self.resolved_port + DEFAULT_METRICS_PORT_OFFSET if self.resolved_port else 0

    @classmethod
    def load(cls) -> AutopilotSettings:
        return cls(platform=PlatformSettings.load())
