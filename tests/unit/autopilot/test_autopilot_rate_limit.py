"""Token buckets: the wait they ask for, against an explicit schedule."""

from __future__ import annotations

import pytest

from cellpilot.autopilot.rate_limit import KeyedBuckets, TokenBucket


@pytest.mark.parametrize(
    ("rate", "burst", "times", "waits"),
    [
        (1.0, 1, [0.0, 0.0, 0.0], [0.0, 1.0, 2.0]),
        (2.0, 2, [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.5, 1.0]),
        (1.0, 1, [0.0, 1.0, 2.5, 2.5], [0.0, 0.0, 0.0, 1.0]),
        (10.0, 5, [0.0] * 6 + [10.0], [0.0] * 5 + [0.1, 0.0]),
    ],
    ids=["one-per-second", "burst-of-two", "refilled-in-time", "refills-to-burst"],
)
def test_waits_follow_the_rate(rate: float, burst: int, times: list[float], waits: list[float]) -> None:
    bucket = TokenBucket(rate, burst)
    assert [bucket.reserve(t) for t in times] == pytest.approx(waits)


def test_keys_have_separate_buckets_and_full_ones_are_forgotten_when_needed() -> None:
    buckets = KeyedBuckets(rate=1.0, burst=1, max_keys=2)
    assert buckets.reserve("a", 0.0) == 0.0
    assert buckets.reserve("b", 0.0) == 0.0
    assert buckets.reserve("a", 0.0) == pytest.approx(1.0)
    assert buckets.reserve("c", 5.0) == 0.0  # a and b refilled and were dropped
    assert len(buckets) == 1
