"""The actuator's one settings class (environment prefix ``CELLPILOT_ACTUATOR_``).

Built once in ``__main__`` and passed down. It serves gRPC health only, on ``base_port``
(7600 by default) unless ``port`` is set.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from cellpilot.platform.metrics import DEFAULT_METRICS_PORT_OFFSET
from cellpilot.platform.settings import PlatformSettings
from cellpilot.security.tls import SecuritySettings


class ActuatorSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CELLPILOT_ACTUATOR_", extra="ignore")

    platform: PlatformSettings = Field(default_factory=PlatformSettings)
    # mTLS certificates, token secret, request size limit (CELLPILOT_TLS_MODE, CELLPILOT_CERTS_DIR).
    security: SecuritySettings = Field(default_factory=SecuritySettings.load)

    replica_index: int = Field(
        default=0,
        ge=0,
        validation_alias=AliasChoices("CELLPILOT_ACTUATOR_REPLICA_INDEX", "CELLPILOT_REPLICA_INDEX"),
    )
    replica_id: str = ""  # default "actuator-<replica_index>"
    listen_host: str = "127.0.0.1"
    base_port: int = Field(default=7600, ge=1, le=65_000)
    port: int = Field(default=-1, ge=-1, le=65_535)  # -1: base_port + replica_index; 0: any free port
    # Prometheus /metrics: -1 = the gRPC port + 1000, 0 = any free port.
    metrics_port: int = Field(default=-1, ge=-1, le=65_535)
    # The Borgmaster replicas (comma-separated in the environment); writes follow its master.
    borgmaster_addresses: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["127.0.0.1:7100", "127.0.0.1:7101", "127.0.0.1:7102"]
    )

    actuations_topic: str = "actuations"
    redis_prefix: str = "cellpilot:actuator"
    max_poll_records: int = Field(default=200, ge=1)
    result_ttl_s: int = Field(default=7 * 24 * 3600, ge=1)  # how long a settled key is remembered

    # Rate limits (token buckets): every limit change may move tasks (Autopilot §2.3), so
    # neither one job nor the whole cell is changed faster than this.
    per_job_rate_per_s: float = Field(default=1.0, gt=0)
    per_job_burst: float = Field(default=3.0, ge=1)
    global_rate_per_s: float = Field(default=200.0, gt=0)
    global_burst: float = Field(default=400.0, ge=1)

    # Retries while the Borgmaster fails over: each attempt follows the master for up to
    # call_budget_s; attempts back off exponentially from initial to max.
    max_attempts: int = Field(default=8, ge=1)
    call_budget_s: float = Field(default=5.0, gt=0)
    initial_backoff_s: float = Field(default=0.2, gt=0)
    max_backoff_s: float = Field(default=5.0, gt=0)

    @field_validator("borgmaster_addresses", mode="before")
    @classmethod
    def _split_addresses(cls, value: object) -> object:
        if isinstance(value, str):
            return [item.strip() for item in value.split(",") if item.strip()]
        return value

    @property
    def resolved_replica_id(self) -> str:
        return self.replica_id or f"actuator-{self.replica_index}"

    @property
    def resolved_port(self) -> int:
        return self.base_port + self.replica_index if self.port < 0 else self.port

    @property
    def resolved_metrics_port(self) -> int:
        if self.metrics_port >= 0:
            return self.metrics_port
        return self.resolved_port + DEFAULT_METRICS_PORT_OFFSET if self.resolved_port else 0

    @classmethod
    def load(cls) -> ActuatorSettings:
        return cls(platform=PlatformSettings.load())
