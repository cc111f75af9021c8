"""Learning CPU demand moments from poll samples, and counting machine CPU overflow (GPA §4, §5)."""

from __future__ import annotations

import numpy as np
import pytest

from cellpilot.schedule.cpu_demand import (
    CpuDemandMoments,
    CpuLearning,
    OverflowMeter,
    machines_overflowing,
    pooled_moments,
    welford_step,
)


def test_welford_is_exact_within_the_window_then_forgets_exponentially() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(300.0, 50.0, size=80)
    count, mean, var = np.zeros(1, dtype=np.int64), np.zeros(1), np.zeros(1)
    for sample in x:
        count, mean, var = welford_step(count, mean, var, [sample], window=100)
    assert mean[0] == pytest.approx(x.mean())
    assert var[0] == pytest.approx(x.var())
    # A step in the load: with window 20 the moments follow the new level.
    for _ in range(300):
        count, mean, var = welford_step(count, mean, var, [900.0], window=20)
    assert mean[0] == pytest.approx(900.0, abs=0.01)
    assert var[0] < 1.0


def test_pooled_moments_are_the_mixture_of_the_tasks() -> None:
    mean, var = pooled_moments([100.0, 300.0], [400.0, 900.0])
    assert mean == 200.0
    assert var == pytest.approx(650.0 + 100.0**2)
    with pytest.raises(ValueError, match="no moments"):
        pooled_moments([], [])


def test_moments_per_task_need_min_samples_and_forget_stopped_tasks() -> None:
    moments: CpuDemandMoments[tuple[str, int]] = CpuDemandMoments(CpuLearning(window=50, min_samples=3))
    keys = [("a/j", i) for i in range(100)]  # more than the initial capacity: the arrays grow
    for step in range(3):
        moments.observe(keys, np.arange(100.0) + step)
        if step < 2:
            assert moments.known() == {}
    known = moments.known()
    assert known[("a/j", 7)] == pytest.approx((8.0, np.sqrt(2 / 3)))
    moments.retain(keys[:10])
    assert len(moments) == 10
    assert set(moments.known()) == set(keys[:10])
    moments.observe([("a/j", 99)], [5.0])  # a returning task starts afresh
    assert ("a/j", 99) not in moments.known()
    with pytest.raises(ValueError, match="finite"):
        moments.observe([("a/j", 0)], [-1.0])
    with pytest.raises(ValueError, match="keys"):
        moments.observe([("a/j", 0)], [1.0, 2.0])
    with pytest.raises(ValueError, match="window"):
        CpuLearning(window=1)


def test_overflow_meter_counts_machine_samples_over_capacity_in_a_recent_window() -> None:
    assert machines_overflowing([8000.0, 8001.5, 7999.0], [8000.0] * 3).tolist() == [False, True, False]
    meter = OverflowMeter(window=4)
    meter.observe([9000.0, 100.0], [8000.0, 8000.0])  # one of two overflowed
    meter.observe([100.0, 100.0], [8000.0, 8000.0])
    counts = meter.counts()
    assert (counts.machine_samples, counts.overflowed_samples) == (4, 1)
    assert counts.recent_rate == 0.25
    meter.observe([100.0, 100.0], [8000.0, 8000.0])  # the first batch leaves the window
    counts = meter.counts()
    assert (counts.machine_samples, counts.overflowed_samples) == (6, 1)
    assert (counts.recent_samples, counts.recent_overflowed) == (4, 0)
    meter.clear()
    assert meter.counts().machine_samples == 0
    assert meter.counts().recent_rate == 0.0
