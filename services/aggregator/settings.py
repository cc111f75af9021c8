"""The aggregator's one settings class (environment prefix ``CELLPILOT_AGGREGATOR_``).

Built once in ``__main__`` and passed down. Replica ``i`` serves the Monitoring API on
``base_port + i`` (7300, 7301 by default) unless ``port`` is set; its id is
``aggregator-<i>``.
"""

from __future__ import annotations

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from cellpilot.platform.metrics import DEFAULT_METRICS_PORT_OFFSET
from cellpilot.platform.settings import PlatformSettings
from cellpilot.platform.topics import TOPICS
from cellpilot.security.tls import SecuritySettings


def _partitions(topic: str) -> int:
    return next(t.partitions for t in TOPICS if t.name == topic)


class AggregatorSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CELLPILOT_AGGREGATOR_", extra="ignore")

    platform: PlatformSettings = Field(default_factory=PlatformSettings)
    # mTLS certificates, token secret, request size limit (CELLPILOT_TLS_MODE, CELLPILOT_CERTS_DIR).
    security: SecuritySettings = Field(default_factory=SecuritySettings.load)

    replica_index: int = Field(
        default=0,
        ge=0,
        validation_alias=AliasChoices("CELLPILOT_AGGREGATOR_REPLICA_INDEX", "CELLPILOT_REPLICA_INDEX"),
    )
    replica_id: str = ""  # default "aggregator-<replica_index>"
    listen_host: str = "127.0.0.1"
    base_port: int = Field(default=7300, ge=1, le=65_000)
    port: int = Field(default=-1, ge=-1, le=65_535)  # -1: base_port + replica_index; 0: any free port
    # Prometheus /metrics: -1 = the gRPC port + 1000 (8300, 8301), 0 = any free port.
    metrics_port: int = Field(default=-1, ge=-1, le=65_535)
    apply_migrations: bool = True

    samples_topic: str = "usage.samples"
    sample_partitions: int = Field(default=_partitions("usage.samples"), ge=1)
    histograms_topic: str = "usage.histograms"
    consumer_group: str = "aggregator"  # as platform/topics.py declares for usage.samples

    # Event time (Autopilot §3.2.1: 5-minute windows). A window closes once the watermark
    # (latest event time seen on the partition minus the out-of-orderness) has passed its
    # end by the grace period; samples arriving later are counted late and dropped.
    window_ms: int = Field(default=300_000, gt=0)
    out_of_orderness_ms: int = Field(default=10_000, ge=0)
    grace_ms: int = Field(default=30_000, ge=0)

    # Checkpoints (wall time): each partition's open windows and offset are saved this often
    # (and whenever a window closes); a partition with no input for idle_after_s flushes its
    # open windows and is no longer waited for when summing job windows.
    checkpoint_interval_s: float = Field(default=5.0, gt=0)
    idle_after_s: float = Field(default=10.0, gt=0)
    job_stage_interval_s: float = Field(default=1.0, gt=0)
    publish_batch: int = Field(default=5_000, ge=1)
    max_poll_records: int = Field(default=2_000, ge=1)
    fold_every_samples: int = Field(default=200_000, ge=1)

    @property
    def resolved_replica_id(self) -> str:
        return self.replica_id or f"aggregator-{self.replica_index}"

    @property
    def resolved_port(self) -> int:
        return self.base_port + self.replica_index if self.port < 0 else self.port

    @property
    def resolved_metrics_port(self) -> int:
        if self.metrics_port >= 0:
            return self.metrics_port
        return self.resolved_port + DEFAULT_METRICS_PORT_OFFSET if self.resolved_port else 0

    @classmethod
    def load(cls) -> AggregatorSettings:
        return cls(platform=PlatformSettings.load())
