"""Horizontal autoscaling (§3.3): sources and each stabiliser on a scripted load curve."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cellpilot.job_vocabulary import HorizontalStatistic
from cellpilot.recommend.horizontal import (
    HOUR_MS,
    MINUTE_MS,
    CpuUtilisationSource,
    DeferredDownscaling,
    DeferSmallChanges,
    HorizontalReason,
    LimitGrowth,
    SlowDecay,
    StabiliserConfig,
    TargetSizeSource,
    initial_cpu_source,
    initial_stabiliser_state,
    stabilise,
    update_cpu_source,
)

FIVE = 5 * MINUTE_MS
OFF = StabiliserConfig(deferred_downscaling=None, slow_decay=None)


def closed_loop(
    config: StabiliserConfig, script: list[tuple[int, float]], start: int, initialising: int = 0
) -> list[tuple[int, int, HorizontalReason]]:
    """Feed (time, raw) and apply each target as the next current count: [(time, target, reason)]."""
    state = initial_stabiliser_state(1, config)
    current = start
    out = []
    for t, raw in script:
        state, decision = stabilise(
            config, state, np.array([raw]), np.array([current]), np.array([t]), np.array([initialising])
        )
        current = int(decision.target[0])
        out.append((t, current, HorizontalReason(int(decision.reason[0]))))
    return out


def test_deferred_downscaling_scales_up_at_once_and_down_after_t_d() -> None:
    config = StabiliserConfig(deferred_downscaling=DeferredDownscaling(window_ms=HOUR_MS), slow_decay=None)
    raw = lambda t: 10.0 if t < 30 * MINUTE_MS else (20.0 if t < 60 * MINUTE_MS else 5.0)  # noqa: E731
    script = [(k * FIVE, raw(k * FIVE)) for k in range(36)]
    targets = {t // MINUTE_MS: target for t, target, _ in closed_loop(config, script, start=10)}
    reasons = {t // MINUTE_MS: reason for t, _, reason in closed_loop(config, script, start=10)}
    assert targets[25] == 10
    assert targets[30] == 20
    # The last raw 20 was at 55 min; with T_d = 1 h it is the maximum until 55 + 60 min.
    assert all(targets[m] == 20 for m in range(60, 115, 5))
    assert all(reasons[m] is HorizontalReason.DEFERRED_DOWNSCALING for m in range(60, 115, 5))
    assert targets[115] == 5
    assert reasons[115] is HorizontalReason.NONE


def test_slow_decay_halves_the_task_count_over_the_period() -> None:
    config = StabiliserConfig(deferred_downscaling=None, slow_decay=SlowDecay())
    script = [(k * MINUTE_MS, 10.0) for k in range(121)]  # an update every minute for 2 h
    history = closed_loop(config, script, start=100)
    by_minute = {t // MINUTE_MS: target for t, target, _ in history}
    assert by_minute[0] == 100
    assert by_minute[60] == 50  # halved over the default one-hour period
    assert by_minute[120] == 25
    # Tasks are removed only every 5 minutes, and some are removed at each of those steps.
    for minute in range(1, 121):
        if minute % 5:
            assert by_minute[minute] == by_minute[minute - 1]
        else:
            assert by_minute[minute] < by_minute[minute - 1]
    assert all(reason is HorizontalReason.SLOW_DECAY for _, _, reason in history[1:])
    # It never goes below the stabilised recommendation.
    long_run = closed_loop(config, [(k * FIVE, 10.0) for k in range(100)], start=100)
    assert min(target for _, target, _ in long_run) == 10
    assert long_run[-1][2] is HorizontalReason.NONE


@pytest.mark.parametrize(
    ("raw", "expected", "reason"),
    [
        (103.0, 100, HorizontalReason.SMALL_CHANGE_IGNORED),
        (97.0, 100, HorizontalReason.SMALL_CHANGE_IGNORED),
        (105.0, 100, HorizontalReason.SMALL_CHANGE_IGNORED),
        (106.0, 106, HorizontalReason.NONE),
        (94.0, 94, HorizontalReason.NONE),
    ],
    ids=["small-up", "small-down", "at-threshold", "large-up", "large-down"],
)
def test_small_changes_are_ignored(raw: float, expected: int, reason: HorizontalReason) -> None:
    config = StabiliserConfig(
        deferred_downscaling=None, slow_decay=None, defer_small_changes=DeferSmallChanges(min_fraction=0.05)
    )
    [(_, target, why)] = closed_loop(config, [(0, raw)], start=100)
    assert (target, why) == (expected, reason)


@pytest.mark.parametrize(
    ("current", "initialising", "expected"),
    [(100, 0, 110), (100, 4, 106), (100, 10, 100), (100, 30, 100), (3, 0, 4)],
    ids=["none-initialising", "some-initialising", "at-cap", "over-cap", "small-job-may-add-one"],
)
def test_growth_is_capped_by_the_fraction_of_initialising_tasks(
    current: int, initialising: int, expected: int
) -> None:
    config = StabiliserConfig(deferred_downscaling=None, slow_decay=None, limit_growth=LimitGrowth(0.1))
    [(_, target, reason)] = closed_loop(config, [(0, 200.0)], start=current, initialising=initialising)
    assert target == expected
    assert reason is HorizontalReason.GROWTH_LIMITED


def test_growth_reaches_the_target_step_by_step() -> None:
    config = StabiliserConfig(deferred_downscaling=None, slow_decay=None, limit_growth=LimitGrowth(0.1))
    history = closed_loop(config, [(k * FIVE, 150.0) for k in range(10)], start=100)
    assert [target for _, target, _ in history][:5] == [110, 121, 133, 146, 150]


def test_task_count_bounds() -> None:
    config = StabiliserConfig(deferred_downscaling=None, slow_decay=None, min_tasks=2, max_tasks=50)
    assert [t for _, t, _ in closed_loop(config, [(0, 0.0), (FIVE, 80.0)], start=10)] == [2, 50]


def test_nan_raw_recommendation_is_rejected() -> None:
    state = initial_stabiliser_state(1, OFF)
    with pytest.raises(ValueError):
        stabilise(OFF, state, np.array([np.nan]), np.array([1]), np.array([0]))


def feed_cpu(
    source: CpuUtilisationSource, samples: list[tuple[int, float]], limit: float
) -> tuple[float, float]:
    state = initial_cpu_source(1, source)
    r_s = raw = math.nan
    for t, usage in samples:
        state, r, n = update_cpu_source(source, state, np.array([usage]), np.array([t]), np.array([limit]))
        r_s, raw = float(r[0]), float(n[0])
    return r_s, raw


def test_cpu_source_uses_the_max_of_window_averages_over_the_horizon() -> None:
    source = CpuUtilisationSource(target_utilisation=0.5, horizon_ms=HOUR_MS)
    # Two samples in the first window average to 15 cores; then 30 and 20.
    samples = [(0, 10.0), (MINUTE_MS, 20.0), (FIVE, 30.0), (2 * FIVE, 20.0)]
    r_s, raw = feed_cpu(source, samples, limit=2.0)
    assert r_s == 30.0
    assert raw == 30.0  # n_r = r_S / (r* x limit) = 30 / (0.5 x 2)
    # An hour later the 30-core window has left the horizon.
    r_s, _ = feed_cpu(source, [*samples, (FIVE + HOUR_MS, 12.0)], limit=2.0)
    assert r_s == 20.0


def test_cpu_source_p95_and_rounding_up() -> None:
    source = CpuUtilisationSource(target_utilisation=0.8, statistic=HorizontalStatistic.P95)
    samples = [(k * FIVE, float(k + 1)) for k in range(20)]  # window averages 1 .. 20
    r_s, raw = feed_cpu(source, samples, limit=1.0)
    assert r_s == 19.0  # nearest rank: ceil(0.95 * 20) = 19th smallest
    assert raw == math.ceil(19.0 / 0.8)


def test_target_size_source_applies_the_user_function() -> None:
    source = TargetSizeSource(lambda s: s["p95_request_ms"] / 50.0 + s["filespace_tb"])
    raw = source.raw_recommendation({"p95_request_ms": [100.0, 260.0], "filespace_tb": [0.0, 1.0]})
    assert raw.tolist() == [2.0, 7.0]
