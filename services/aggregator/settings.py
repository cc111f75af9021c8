"""The aggregator's one settings class (environment prefix ``CELLPILOT_AGGREGATOR_``).

Built once in ``__main__`` and passed down. Replica ``i`` serves the Monitoring API on
``base_port + i`` (7300, 7301 by default) unless ``port`` is set; its id is
``aggregator-<i>``.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from cellpilot.platform.settings import MeteredReplicaSettings
from cellpilot.platform.topics import partitions_of


class AggregatorSettings(MeteredReplicaSettings):
    model_config = SettingsConfigDict(env_prefix="CELLPILOT_AGGREGATOR_", extra="ignore")
    service_name = "aggregator"

    base_port: int = Field(default=7300, ge=1, le=65_000)
    apply_migrations: bool = True

    samples_topic: str = "usage.samples"
    sample_partitions: int = Field(default=partitions_of("usage.samples"), ge=1)
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
