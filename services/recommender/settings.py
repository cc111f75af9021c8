"""The recommender worker's one settings class (environment prefix ``CELLPILOT_RECOMMENDER_``).

Built once in ``__main__`` and passed down. Replica ``i`` serves gRPC health on
``base_port + i`` (7500-7502 by default) unless ``port`` is set; its id is
``recommender-<i>``. All replicas share one consumer group over ``usage.histograms``.
"""

from __future__ import annotations

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from cellpilot.autopilot.ml_config import load_ml_config
from cellpilot.platform.redis_keys import RECOMMENDER_PREFIX
from cellpilot.platform.settings import MeteredReplicaSettings
from cellpilot.platform.topics import partitions_of


class RecommenderSettings(MeteredReplicaSettings):
    model_config = SettingsConfigDict(env_prefix="CELLPILOT_RECOMMENDER_", extra="ignore")
    service_name = "recommender"

    base_port: int = Field(default=7500, ge=1, le=65_000)

    histograms_topic: str = "usage.histograms"
    # Its partition count: a job's state lives with the partition its key hashes to.
    histogram_partitions: int = Field(default=partitions_of("usage.histograms"), ge=1)
    events_topic: str = "borg.events"  # OOM feedback; "" = none
    recommendations_topic: str = "recommendations"
    consumer_group: str = "recommender"  # as platform/topics.py declares for usage.histograms
    # Redis keys of the checkpoints: <prefix>:<group>:p<partition>:{epoch,offsets,jobs}
    state_prefix: str = RECOMMENDER_PREFIX

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
