"""The recommender worker's one settings class (environment prefix ``CELLPILOT_RECOMMENDER_``).

Built once in ``__main__`` and passed down. Replica ``i`` serves gRPC health on
``base_port + i`` (7500-7502 by default) unless ``port`` is set; its id is
``recommender-<i>``. All replicas share one consumer group over ``usage.histograms``.
"""

from __future__ import annotations

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from cellpilot.autopilot.ml_config import load_ml_config
from cellpilot.platform.metrics import DEFAULT_METRICS_PORT_OFFSET
from cellpilot.platform.settings import PlatformSettings
from cellpilot.platform.topics import TOPICS
from cellpilot.security.tls import SecuritySettings


def _partitions(topic: str) -> int:
    return next(t.partitions for t in TOPICS if t.name == topic)


class RecommenderSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CELLPILOT_RECOMMENDER_", extra="ignore")

    platform: PlatformSettings = Field(default_factory=PlatformSettings)
    # mTLS certificates, token secret, request size limit (CELLPILOT_TLS_MODE, CELLPILOT_CERTS_DIR).
    security: SecuritySettings = Field(default_factory=SecuritySettings.load)

    replica_index: int = Field(
        default=0,
        ge=0,
        validation_alias=AliasChoices("CELLPILOT_RECOMMENDER_REPLICA_INDEX", "CELLPILOT_REPLICA_INDEX"),
    )
    replica_id: str = ""  # default "recommender-<replica_index>"
    listen_host: str = "127.0.0.1"
    base_port: int = Field(default=7500, ge=1, le=65_000)
    port: int = Field(default=-1, ge=-1, le=65_535)  # -1: base_port + replica_index; 0: any free port
    # Prometheus /metrics: -1 = the gRPC port + 1000 (8500-8502), 0 = any free port.
    metrics_port: int = Field(default=-1, ge=-1, le=65_535)

    histograms_topic: str = "usage.histograms"
    # Its partition count: a job's state lives with the partition its key hashes to.
    histogram_partitions: int = Field(default=_partitions("usage.histograms"), ge=1)
    events_topic: str = "borg.events"  # OOM feedback; "" = none
    recommendations_topic: str = "recommendations"
    consumer_group: str = "recommender"  # as platform/topics.py declares for usage.histograms
    # Redis keys of the checkpoints: <prefix>:<group>:p<partition>:{epoch,offsets,jobs}
    state_prefix: str = "cellpilot:recommender"

    # Raise the CPU recommendations of jobs whose demand went unserved (throttled CPU, measured
    # by the Borglets): cellpilot.recommend.unmet_demand. Off: the paper's recommenders.
    raise_cpu_for_unmet_demand: bool = False

    # The ML recommender's hyperparameters (Autopilot §3.2.3): "" = the tuned file shipped in
    # cellpilot/autopilot/data/ml_tuned.json; a path = this cell's own (same JSON format).
    ml_config: str = ""

    @field_validator("ml_config")
    @classmethod
    def _ml_config_loads(cls, value: str) -> str:
        load_ml_config(value or None)  # a bad file fails at start-up, naming itself
        return value

    max_poll_records: int = Field(default=2_000, ge=1)
    poll_timeout_ms: int = Field(default=200, ge=1)

    @property
    def resolved_replica_id(self) -> str:
        return self.replica_id or f"recommender-{self.replica_index}"

    @property
    def resolved_port(self) -> int:
        return self.base_port + self.replica_index if self.port < 0 else self.port

    @property
    def resolved_metrics_port(self) -> int:
        if self.metrics_port >= 0:
            return self.metrics_port
        return self.resolved_port + DEFAULT_METRICS_PORT_OFFSET if self.resolved_port else 0

    @classmethod
    def load(cls) -> RecommenderSettings:
        return cls(platform=PlatformSettings.load())
