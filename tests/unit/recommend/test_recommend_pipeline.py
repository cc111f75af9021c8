"""Composed recommenders: estimator + post-processors, explanations, per-job vs batched, restart."""

from __future__ import annotations

import numpy as np
import pytest

from cellpilot.recommend.explanation import JobSettings
from cellpilot.recommend.ml_ensemble import EnsembleConfig, ModelGrid
from cellpilot.recommend.pipeline import (
    RecommenderState,
    VerticalRecommender,
    ml_recommender,
    moving_window_recommender,
)
from cellpilot.recommend.policy import JobProfile, OomTolerance, Statistic, statistic_codes
from cellpilot.recommend.post_processing import ClampReason, MarginCurve
from cellpilot.usage.buckets import CPU_SCHEME, MEMORY_SCHEME, Resource
from cellpilot.usage.histogram import Histogram

FIVE = 300_000


def cpu_history(rng: np.random.Generator, jobs: int, steps: int) -> np.ndarray:
    """(steps, jobs, K) CPU histograms: 300 one-second samples per window around a drifting level."""
    out = np.zeros((steps, jobs, CPU_SCHEME.size))
    level = rng.uniform(0.05, 20.0, size=jobs)
    for t in range(steps):
        level *= rng.uniform(0.8, 1.25, size=jobs)
        for j in range(jobs):
            values = rng.gamma(4.0, level[j] / 4.0, size=300)
            out[t, j] = np.bincount(CPU_SCHEME.index_of(values), minlength=CPU_SCHEME.size)
    return out


def small_ml() -> VerticalRecommender:
    return ml_recommender(
        Resource.CPU, config=EnsembleConfig(grid=ModelGrid.product((0.5, 0.05), (0.0, 0.1)))
    )


RECOMMENDERS = {
    "window-cpu-serving": moving_window_recommender(Resource.CPU),
    "window-memory-intermediate": moving_window_recommender(
        JobProfile(Resource.MEMORY, oom_tolerance=OomTolerance.INTERMEDIATE), scheme=CPU_SCHEME
    ),
    "ml-cpu": small_ml(),
}


@pytest.mark.parametrize("name", list(RECOMMENDERS), ids=list(RECOMMENDERS))
def test_per_job_updates_equal_the_batched_update(name: str) -> None:
    recommender = RECOMMENDERS[name]
    rng = np.random.default_rng(3)
    history = cpu_history(rng, jobs=4, steps=8)
    batch_state = recommender.initial_state(4)
    singles = batch_state.split()
    for t in range(history.shape[0]):
        batch_state, batch = recommender.update_batch(batch_state, history[t], np.full(4, (t + 1) * FIVE))
        for j in range(4):
            hist = Histogram(CPU_SCHEME, t * FIVE, FIVE, history[t, j])
            singles[j], rec = recommender.update(singles[j], hist)
            assert rec == batch.row(j)
    assert RecommenderState.concat(singles).equals(batch_state)


@pytest.mark.parametrize("name", list(RECOMMENDERS), ids=list(RECOMMENDERS))
def test_a_restarted_worker_continues_exactly(name: str) -> None:
    recommender = RECOMMENDERS[name]
    history = cpu_history(np.random.default_rng(5), jobs=3, steps=10)
    uninterrupted = recommender.initial_state(3)
    outputs = []
    for t in range(10):
        uninterrupted, batch = recommender.update_batch(uninterrupted, history[t], np.full(3, t * FIVE))
        outputs.append(batch.value)
    resumed = recommender.initial_state(3)
    for t in range(10):
        if t == 6:  # crash: another worker loads the bytes
            resumed = RecommenderState.from_bytes(resumed.to_bytes())
        resumed, batch = recommender.update_batch(resumed, history[t], np.full(3, t * FIVE))
        assert np.array_equal(batch.value, outputs[t], equal_nan=True)
    assert resumed.equals(uninterrupted)


def test_moving_window_explanation_records_margin_hour_max_and_clamp() -> None:
    recommender = moving_window_recommender(
        JobProfile(Resource.MEMORY, oom_tolerance=OomTolerance.MINIMAL),
        margin=MarginCurve(small_limit=1.0, large_limit=2.0, small_margin=0.125, large_margin=0.125),
    )
    state = recommender.initial_state()
    gib = 2.0**30
    high = Histogram.from_peak(MEMORY_SCHEME, 0, [4 * gib])
    state, first = recommender.update(state, high)
    s_max = float(MEMORY_SCHEME.value_of(MEMORY_SCHEME.index_of(4 * gib)))
    assert first.source == "moving_window:max"
    assert first.raw_value == s_max
    assert first.value == pytest.approx(s_max * 1.125)
    assert first.margin == pytest.approx(0.125)
    assert first.clamp is ClampReason.NONE
    assert not first.raised_by_window_max
    # The next window's peak is lower; S_max (over N = 288 samples) is unchanged, but with an
    # explicit statistic of S_avg the value drops, and the max over the last hour holds it.
    low = Histogram.from_peak(MEMORY_SCHEME, FIVE, [1 * gib])
    _, held = recommender.update(state, low, JobSettings.single(statistic=Statistic.AVG))
    assert held.source == "moving_window:avg"
    assert held.raw_value is not None
    assert held.raw_value < first.raw_value
    assert held.raised_by_window_max
    assert held.value == first.value
    # User bounds clamp last and say so.
    _, clamped = recommender.update(state, low, JobSettings.single(upper=2 * gib))
    assert clamped.value == 2 * gib
    assert clamped.clamp is ClampReason.UPPER_BOUND
    assert "upper bound" in clamped.explain()
    assert "safety margin" in clamped.explain()
    assert clamped.details["max"] == s_max


def test_per_job_statistics_in_one_batch() -> None:
    recommender = moving_window_recommender(Resource.CPU, hour_max=False)
    counts = np.zeros((2, CPU_SCHEME.size))
    counts[:, 100] = 50
    counts[:, 200] = 50
    settings = JobSettings(statistic=statistic_codes([Statistic.MAX, Statistic.AVG]))
    _, batch = recommender.update_batch(recommender.initial_state(2), counts, np.zeros(2), settings)
    rows = batch.rows()
    assert [r.source for r in rows] == ["moving_window:max", "moving_window:avg"]
    assert rows[0].raw_value == CPU_SCHEME.boundaries[200]
    assert rows[1].raw_value == pytest.approx((CPU_SCHEME.boundaries[100] + CPU_SCHEME.boundaries[200]) / 2)


def test_ml_recommendation_names_its_model_and_waits_for_usage() -> None:
    recommender = small_ml()
    state = recommender.initial_state()
    state, nothing = recommender.update(state, Histogram.empty(CPU_SCHEME, 0))
    assert nothing.value is None
    assert "no usage" in nothing.explain()
    state, rec = recommender.update(state, Histogram.from_values(CPU_SCHEME, FIVE, [0.5] * 300))
    assert rec.source.startswith("ml:model ")
    assert "d=" in rec.source
    assert rec.value is not None
    assert rec.value >= 0.5
    assert {"model_raw_limit", "model_margin", "model_cost"} <= set(rec.details)


def test_misuse_is_reported() -> None:
    recommender = moving_window_recommender(Resource.CPU)
    with pytest.raises(ValueError):
        recommender.update(recommender.initial_state(2), Histogram.empty(CPU_SCHEME, 0))
    with pytest.raises(ValueError):
        recommender.update(recommender.initial_state(), Histogram.empty(MEMORY_SCHEME, 0))
    with pytest.raises(ValueError):  # a moving-window state fed to the ML pipeline
        RECOMMENDERS["ml-cpu"].update(recommender.initial_state(), Histogram.empty(CPU_SCHEME, 0))
