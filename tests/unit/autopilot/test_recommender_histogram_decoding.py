"""The recommender worker refuses a histogram of another bucket scheme, naming the field and both
schemes; a histogram under the legacy cores scheme is read as the millicore one."""

from __future__ import annotations

import pytest

from cellpilot.api.v1 import resources_pb2, usage_pb2
from cellpilot.autopilot.job_recommendations import RecommenderConfig
from cellpilot.platform.kafka import PoisonRecordError, Record
from cellpilot_services.recommender.convert import histogram_in


def test_a_histogram_of_another_bucket_scheme_is_poison_naming_both_schemes() -> None:
    config = RecommenderConfig()
    expected_id, expected_version = config.cpu.scheme.key()
    message = usage_pb2.UsageHistogram(
        job_id="alice/web",
        resource=resources_pb2.RESOURCE_CPU,
        bucket_scheme_id="other-scheme",
        bucket_scheme_version=expected_version + 1,
        window_start_ms=0,
        window_end_ms=300_000,
    )
    record = Record("usage.histograms", 0, 0, "alice/web", message.SerializeToString(), (), 0)
    with pytest.raises(PoisonRecordError) as refused:
        histogram_in(record, config)
    said = str(refused.value)
    assert "UsageHistogram.bucket_scheme_id" in said
    assert f"'other-scheme' v{expected_version + 1}" in said
    assert f"expected {expected_id!r} v{expected_version}" in said


def test_a_histogram_under_the_legacy_cores_scheme_is_read_in_the_millicore_scheme() -> None:
    """A message the aggregator sent before CPU histograms were in millicores (still in Kafka
    after an upgrade): same bucket indices, usage already in millicores on the wire."""
    message = usage_pb2.UsageHistogram(
        job_id="alice/web",
        resource=resources_pb2.RESOURCE_CPU,
        bucket_scheme_id="cpu-cores-geometric",
        bucket_scheme_version=1,
        window_start_ms=0,
        window_end_ms=300_000,
        bucket_indices=[120, 130],
        counts=[3, 1],
        mean_total_usage=1500.0,
    )
    record = Record("usage.histograms", 0, 0, "alice/web", message.SerializeToString(), (), 0)
    got = histogram_in(record, RecommenderConfig())
    assert got.counts[120] == 3.0
    assert got.counts[130] == 1.0
    assert got.counts.sum() == 4.0
    assert got.mean_total_usage == 1500.0
