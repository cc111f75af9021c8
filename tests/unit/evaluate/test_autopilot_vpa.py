"""The VPA baseline: exponential histograms, per-interval memory peaks, OOM bump-up, bounds, updater."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cellpilot.evaluate.vpa import (
    CPU_HISTOGRAM,
    DAY_MS,
    HOUR_MS,
    MEMORY_HISTOGRAM,
    MIB,
    VpaConfig,
    VpaEstimate,
    VpaRecommender,
    updater_decision,
)

GIB = 1024.0 * MIB
ONE_TASK = np.array([0], dtype=np.intp)
JOB_OF_TASK = np.array([0, 0, 1], dtype=np.intp)


def bucket_end(value: float, first: float = 1e7, ratio: float = 1.05) -> float:
    """The end of the exponential bucket holding ``value``, by the formula (independent of the code)."""
    k = math.floor(math.log(value * (ratio - 1) / first + 1, ratio))
    return first * (ratio ** (k + 1) - 1) / (ratio - 1)


@pytest.mark.parametrize(
    ("options", "value", "bucket"),
    [
        (MEMORY_HISTOGRAM, 0.0, 0),
        (MEMORY_HISTOGRAM, 9.99e6, 0),
        (MEMORY_HISTOGRAM, 1e7, 1),
        (CPU_HISTOGRAM, 10.5, 1),  # millicores
    ],
    ids=["zero", "inside-first", "second-start", "cpu"],
)
def test_bucket_of(options: object, value: float, bucket: int) -> None:
    assert int(options.bucket_of(np.array([value]))[0]) == bucket  # type: ignore[attr-defined]


@settings(max_examples=60, deadline=None)
@given(st.floats(1.0, 9e11))
def test_a_value_lies_in_its_bucket(value: float) -> None:
    k = MEMORY_HISTOGRAM.bucket_of(np.array([value]))
    assert (
        MEMORY_HISTOGRAM.bucket_start(k)[0] <= value < MEMORY_HISTOGRAM.bucket_start(k + 1)[0] * (1 + 1e-12)
    )


def test_memory_histogram_reaches_a_terabyte() -> None:
    assert MEMORY_HISTOGRAM.bucket_start(MEMORY_HISTOGRAM.buckets - 1) >= 1e12


def _memory(recommender: VpaRecommender, tasks: int = 1, jobs: int = 1) -> object:
    return recommender.initial_state(jobs, tasks)


def test_one_sample_gives_its_bucket_end_plus_margin() -> None:
    vpa = VpaRecommender("memory")
    state = vpa.initial_state(1, 1)
    vpa.add_memory_samples(state, ONE_TASK, ONE_TASK, np.array([2 * GIB]), 0)
    estimate = vpa.estimate(state)
    assert estimate.target[0] == pytest.approx(bucket_end(2 * GIB) * 1.15)


def test_only_the_interval_peak_counts_and_a_new_interval_adds_a_sample() -> None:
    vpa = VpaRecommender("memory")
    state = vpa.initial_state(1, 1)
    for t, usage in ((0, 1 * GIB), (HOUR_MS, 3 * GIB), (2 * HOUR_MS, 2 * GIB)):
        vpa.add_memory_samples(state, ONE_TASK, ONE_TASK, np.array([usage]), t)
    # One sample (the peak, 3 GiB), stamped at the interval's end (t = 24 h): weight 2^(1).
    assert np.count_nonzero(state.weights) == 1
    assert state.weights.sum() == pytest.approx(2.0)
    assert state.weights[0, MEMORY_HISTOGRAM.bucket_of(np.array([3 * GIB]))[0]] == pytest.approx(2.0)
    vpa.add_memory_samples(state, ONE_TASK, ONE_TASK, np.array([1 * GIB]), DAY_MS + HOUR_MS)
    # The next interval [24 h, 48 h) holds its own peak, stamped at 48 h: weight 2^2.
    assert state.weights.sum() == pytest.approx(2.0 + 4.0)


def test_older_samples_weigh_half_per_half_life() -> None:
    vpa = VpaRecommender("cpu")
    state = vpa.initial_state(1, 1)
    vpa.add_cpu_samples(state, ONE_TASK, ONE_TASK, np.array([500.0]), np.array([1.0]), 0)
    vpa.add_cpu_samples(state, ONE_TASK, ONE_TASK, np.array([2000.0]), np.array([1.0]), DAY_MS)
    low = state.weights[0, CPU_HISTOGRAM.bucket_of(np.array([500.0]))[0]]
    high = state.weights[0, CPU_HISTOGRAM.bucket_of(np.array([2000.0]))[0]]
    assert high / low == pytest.approx(2.0)
    # VPA 1.4+: every CPU sample weighs the constant 0.1, whatever the container's request.
    state2 = vpa.initial_state(1, 1)
    vpa.add_cpu_samples(state2, ONE_TASK, ONE_TASK, np.array([500.0]), np.array([1.0]), 0)
    assert state2.weights.sum() == pytest.approx(0.1 * 5)


def test_weights_survive_a_long_history() -> None:
    vpa = VpaRecommender("memory")
    state = vpa.initial_state(1, 1)
    for day in range(0, 400, 10):  # 2^(400) would overflow without re-basing
        vpa.add_memory_samples(state, ONE_TASK, ONE_TASK, np.array([GIB]), day * DAY_MS)
    assert np.isfinite(state.weights).all()
    assert vpa.estimate(state).target[0] == pytest.approx(bucket_end(GIB) * 1.15)


@pytest.mark.parametrize(
    ("request_bytes", "sample"),
    [(1 * GIB, 1.2 * GIB), (200 * MIB, 300 * MIB)],
    ids=["ratio-wins", "min-bump-wins"],
)
def test_oom_bump_up(request_bytes: float, sample: float) -> None:
    vpa = VpaRecommender("memory")
    state = vpa.initial_state(1, 1)
    vpa.record_ooms(state, ONE_TASK, ONE_TASK, np.array([request_bytes]), 0)
    assert vpa.estimate(state).target[0] == pytest.approx(max(bucket_end(sample) * 1.15, 250 * MIB))
    assert state.oom_peak[0] == pytest.approx(sample)


def test_minimum_memory_and_no_recommendation_without_samples() -> None:
    vpa = VpaRecommender("memory")
    state = vpa.initial_state(2, 3)
    vpa.add_memory_samples(state, JOB_OF_TASK, np.array([0, 1]), np.array([10 * MIB, 20 * MIB]), 0)
    estimate = vpa.estimate(state)
    assert estimate.target[0] == pytest.approx(250 * MIB)
    assert np.isnan(estimate.target[1])


def test_confidence_scales_the_bounds() -> None:
    vpa = VpaRecommender("memory")
    state = vpa.initial_state(1, 1)
    # Many tasks-worth of samples over exactly one day: confidence = min(1 day, samples / 1440) = 1.
    for t in range(0, DAY_MS + 1, HOUR_MS):
        vpa.add_memory_samples(state, ONE_TASK, ONE_TASK, np.array([4 * GIB]), t)
    state.samples[0] = 10_000.0
    estimate = vpa.estimate(state)
    p = bucket_end(4 * GIB) * 1.15
    assert vpa.confidence(state)[0] == pytest.approx(1.0)
    assert estimate.upper[0] == pytest.approx(p * 2.0)
    assert estimate.lower[0] == pytest.approx(p * (1.001) ** -2)


def _estimate(target: float, lower: float, upper: float) -> VpaEstimate:
    return VpaEstimate(np.array([target]), np.array([lower]), np.array([upper]))


@pytest.mark.parametrize(
    ("current", "estimate", "since_h", "quick_oom", "expected"),
    [
        (10.0, _estimate(5.0, 4.0, 8.0), 1, False, True),  # above the upper bound
        (3.0, _estimate(5.0, 4.0, 8.0), 1, False, True),  # below the lower bound
        (6.0, _estimate(5.0, 4.0, 8.0), 1, False, False),  # in bounds, too recent
        (6.0, _estimate(5.0, 4.0, 8.0), 13, False, True),  # in bounds, old enough, 17 % change
        (5.2, _estimate(5.0, 4.0, 8.0), 13, False, False),  # in bounds, < 10 % change
        (6.0, _estimate(5.0, 4.0, 8.0), 1, True, True),  # a quick OOM
        (5.0, _estimate(5.0, 4.0, 8.0), 1, True, False),  # nothing to change
        (5.0, _estimate(np.nan, np.nan, np.nan), 100, True, False),  # no recommendation
    ],
    ids=["above", "below", "recent", "settled", "small", "quick-oom", "same", "none"],
)
def test_updater_decision(
    current: float, estimate: VpaEstimate, since_h: int, quick_oom: bool, expected: bool
) -> None:
    decided = updater_decision(
        VpaConfig(), np.array([current]), estimate, np.array([since_h * HOUR_MS]), np.array([quick_oom])
    )
    assert bool(decided[0]) is expected


# -- edge behaviour of the Kubernetes VPA recommender ------------------------------------------


@pytest.mark.parametrize("resource", ["memory", "cpu"])
def test_an_empty_histogram_has_percentile_zero_and_no_recommendation(resource: str) -> None:
    vpa = VpaRecommender(resource)
    state = vpa.initial_state(2, 2)
    for level in (0.0, 0.5, 0.9, 1.0):
        assert vpa.percentile(state, level).tolist() == [0.0, 0.0]
    assert np.isnan(vpa.estimate(state).target).all()


# Weights 1, 1 and 2 in buckets 5, 9 and 20 (total 4); the percentile reports a bucket's end.
SCAN_WEIGHTS = {5: 1.0, 9: 1.0, 20: 2.0}


@pytest.mark.parametrize(
    ("level", "bucket"),
    [
        (-0.5, 5),  # below 0: the first non-empty bucket, not bucket 0
        (0.0, 5),
        (0.25, 5),  # the cumulative weight reaches 1 of 4 at bucket 5
        (0.26, 9),
        (0.5, 9),
        (0.51, 20),
        (1.0, 20),  # the last non-empty bucket, not the histogram's last
        (1.5, 20),  # beyond 1: still the last non-empty bucket
    ],
    ids=["negative", "zero", "quarter", "past-quarter", "half", "past-half", "one", "above-one"],
)
def test_the_percentile_scan_runs_from_the_first_to_the_last_non_empty_bucket(
    level: float, bucket: int
) -> None:
    vpa = VpaRecommender("memory")
    state = vpa.initial_state(1, 1)
    for k, weight in SCAN_WEIGHTS.items():
        state.weights[0, k] = weight
    expected = float(MEMORY_HISTOGRAM.bucket_start(bucket + 1))
    assert vpa.percentile(state, level)[0] == pytest.approx(expected)


def test_the_last_bucket_reports_its_start() -> None:
    vpa = VpaRecommender("memory")
    state = vpa.initial_state(1, 1)
    last = MEMORY_HISTOGRAM.buckets - 1
    state.weights[0, last] = 1.0
    assert vpa.percentile(state, 1.0)[0] == pytest.approx(float(MEMORY_HISTOGRAM.bucket_start(last)))


def test_a_replaced_peak_leaves_no_residue_in_its_bucket() -> None:
    vpa = VpaRecommender("memory")
    state = vpa.initial_state(1, 1)
    vpa.add_memory_samples(state, ONE_TASK, ONE_TASK, np.array([1 * GIB]), 0)
    vpa.add_memory_samples(state, ONE_TASK, ONE_TASK, np.array([3 * GIB]), HOUR_MS)
    # Only the 3 GiB peak is left, so even the 0th percentile reports its bucket.
    assert vpa.percentile(state, 0.0)[0] == pytest.approx(bucket_end(3 * GIB))


TASK_0_AND_1 = np.array([0, 0], dtype=np.intp)  # both tasks belong to job 0


@pytest.mark.parametrize(
    ("samples", "accepted"),
    [
        # (task, time, millicores) in call order -> the values the histogram keeps
        ([(0, 0, 500.0), (0, HOUR_MS, 700.0)], [500.0, 700.0]),
        ([(0, HOUR_MS, 500.0), (0, 0, 700.0)], [500.0]),  # out of time order
        ([(0, HOUR_MS, 500.0), (0, HOUR_MS, 700.0)], [500.0]),  # a duplicate start
        ([(0, HOUR_MS, 500.0), (1, 0, 700.0)], [500.0, 700.0]),  # the order is per task
        ([(0, 0, -1.0)], []),  # negative usage
        ([(0, 0, -1.0), (0, HOUR_MS, 700.0)], [700.0]),  # a discarded sample sets no order
        ([(0, 0, float("nan"))], []),
        ([(0, 0, 0.0)], [0.0]),  # zero is valid usage
    ],
    ids=["in-order", "out-of-order", "duplicate", "per-task", "negative", "after-negative", "nan", "zero"],
)
def test_invalid_and_out_of_order_cpu_samples_are_discarded(
    samples: list[tuple[int, int, float]], accepted: list[float]
) -> None:
    vpa = VpaRecommender("cpu")
    state = vpa.initial_state(1, 2)
    for task, t, value in samples:
        vpa.add_cpu_samples(
            state, TASK_0_AND_1, np.array([task], dtype=np.intp), np.array([value]), np.array([1.0]), t
        )
    kept = {int(k) for k in CPU_HISTOGRAM.bucket_of(np.array(accepted))} if accepted else set()
    assert set(np.flatnonzero(state.weights[0]).tolist()) == kept
    assert state.samples[0] == pytest.approx(5.0 * len(accepted))


def test_a_negative_cpu_point_drops_only_that_point() -> None:
    vpa = VpaRecommender("cpu")
    state = vpa.initial_state(1, 1)
    points = np.array([-5.0, 400.0])
    vpa.add_cpu_samples(state, ONE_TASK, np.array([0, 0], dtype=np.intp), points, np.array([0.5, 0.5]), 0)
    assert state.weights.sum() == pytest.approx(0.5 * 5 * 0.1)
    assert state.weights[0, CPU_HISTOGRAM.bucket_of(np.array([400.0]))[0]] > 0.0


@pytest.mark.parametrize(
    ("usage", "peak"),
    [
        ([1 * GIB, -1.0], 1 * GIB),  # a negative sample neither replaces nor opens anything
        ([-1.0], 0.0),
        ([float("nan"), 2 * GIB], 2 * GIB),
        ([1 * GIB, 2 * GIB], 2 * GIB),
    ],
    ids=["negative-after", "negative-only", "nan-first", "valid"],
)
def test_negative_memory_samples_are_discarded(usage: list[float], peak: float) -> None:
    vpa = VpaRecommender("memory")
    state = vpa.initial_state(1, 1)
    for i, value in enumerate(usage):
        vpa.add_memory_samples(state, ONE_TASK, ONE_TASK, np.array([value]), i * HOUR_MS)
    assert state.usage_peak[0] == pytest.approx(peak)
    if peak == 0.0:
        assert not state.weights.any()
        assert state.interval_end_ms[0] == -1
    else:
        bucket = int(MEMORY_HISTOGRAM.bucket_of(np.array([peak]))[0])
        assert np.flatnonzero(state.weights[0]).tolist() == [bucket]


FIRST_SAMPLE_MS = 10 * DAY_MS  # opens the memory interval [10 d, 11 d)


@pytest.mark.parametrize(
    ("sampled", "oom_ms", "counted"),
    [
        (True, FIRST_SAMPLE_MS + HOUR_MS, True),  # inside the current interval
        (True, FIRST_SAMPLE_MS, True),  # at the interval's start
        (True, FIRST_SAMPLE_MS - 1, False),  # older than the interval: ignored
        (True, FIRST_SAMPLE_MS - 3 * DAY_MS, False),
        (False, 0, True),  # no memory sample yet: every OOM counts
    ],
    ids=["inside", "at-start", "just-older", "days-older", "no-interval"],
)
def test_an_oom_older_than_the_memory_interval_is_ignored(sampled: bool, oom_ms: int, counted: bool) -> None:
    vpa = VpaRecommender("memory")
    state = vpa.initial_state(1, 1)
    if sampled:
        vpa.add_memory_samples(state, ONE_TASK, ONE_TASK, np.array([1 * GIB]), FIRST_SAMPLE_MS)
    before = state.weights.copy()
    vpa.record_ooms(state, ONE_TASK, ONE_TASK, np.array([2 * GIB]), oom_ms)
    assert bool(state.oom_peak[0] == pytest.approx(2.4 * GIB)) is counted
    assert (not np.array_equal(state.weights, before)) is counted
