"""Every built-in recommender from one shared state, checked against its building blocks."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from cellpilot.autopilot.candidates import (
    WINDOW_STATISTICS,
    CandidateConfig,
    CandidateState,
    UsageSignalConfig,
    apply_oom,
    initial_candidate_state,
    initial_usage_signal,
    oom_bumped_value,
    update_candidates,
    update_usage_signal,
)
from cellpilot.autopilot.recommender_registry import BUILTIN_RECOMMENDERS
from cellpilot.job_vocabulary import HorizontalStatistic, RecommenderKind
from cellpilot.recommend.ml_ensemble import EnsembleConfig, ModelGrid, initial_ensemble_state, update_ensemble
from cellpilot.recommend.moving_window import initial_window_state, update_window
from cellpilot.recommend.policy import evaluate_statistics
from cellpilot.recommend.post_processing import initial_window_max, update_window_max
from cellpilot.units import GIB
from cellpilot.usage.buckets import Resource

FIVE_MIN = 300_000
SMALL_GRID = EnsembleConfig(grid=ModelGrid.product((0.5, 0.05), (0.0, 0.1)))


def histories(resource: Resource, jobs: int, steps: int, seed: int = 1) -> list[np.ndarray]:
    """Per step a (jobs, K) matrix of plausible histograms (a few tasks' samples)."""
    config = CandidateConfig.for_resource(resource)
    rng = np.random.default_rng(seed)
    level = rng.uniform(0.2, 4.0, jobs) if resource is Resource.CPU else rng.uniform(0.2, 8.0, jobs) * GIB
    out = []
    for step in range(steps):
        values = level[:, None] * rng.lognormal(0.0, 0.2, (jobs, 20)) * (1.5 if step > steps // 2 else 1.0)
        counts = np.zeros((jobs, config.scheme.size))
        for j in range(jobs):
            np.add.at(counts[j], config.scheme.index_of(values[j]), 1.0)
        out.append(counts)
    return out


@pytest.mark.parametrize("resource", [Resource.CPU, Resource.MEMORY], ids=["cpu", "memory"])
def test_each_candidate_is_its_estimator_plus_margin_plus_the_max_over_the_last_hour(
    resource: Resource,
) -> None:
    """§3.2.2: statistic -> safety margin -> max over the last hour; §3.2.3: ensemble (eq. 7's
    margins per model) -> max over the last hour; each checked against its building blocks."""
    config = CandidateConfig.for_resource(resource, SMALL_GRID)
    jobs, steps = 5, 20
    state = initial_candidate_state(config, jobs)
    window = initial_window_state(jobs, config.scheme.size, config.window)
    ensemble = initial_ensemble_state(jobs, config.scheme.size, SMALL_GRID)
    rings = [initial_window_max(jobs, config.hour_max_slots) for _ in BUILTIN_RECOMMENDERS]
    boundaries = config.scheme.boundaries
    for step, counts in enumerate(histories(resource, jobs, steps)):
        t = np.full(jobs, (step + 1) * FIVE_MIN, dtype=np.int64)
        state, batch = update_candidates(config, state, counts, t)
        window, stats = update_window(config.window, boundaries, window, counts, t)
        ensemble, decision = update_ensemble(SMALL_GRID, boundaries, ensemble, counts, t)
        for c, kind in enumerate(BUILTIN_RECOMMENDERS):
            if kind is RecommenderKind.ML:
                expected = decision.limit
            else:
                raw, _ = evaluate_statistics(np.full(jobs, WINDOW_STATISTICS[kind], np.int8), stats)
                expected, _ = config.margin.apply(raw)
                np.testing.assert_allclose(batch.raw_value[:, c], raw, rtol=1e-12)
            rings[c], hour_max = update_window_max(rings[c], expected, t, config.hour_max_slot_ms)
            np.testing.assert_allclose(batch.value[:, c], np.fmax(expected, hour_max), rtol=1e-12)


def test_a_caller_may_skip_a_group_of_candidates_without_changing_the_others() -> None:
    full = CandidateConfig.for_resource(Resource.MEMORY, SMALL_GRID)
    no_ml = replace(full, with_ml=False)
    only_ml = replace(full, with_window=False)
    states = {c: initial_candidate_state(c, 3) for c in (full, no_ml, only_ml)}
    ml = BUILTIN_RECOMMENDERS.index(RecommenderKind.ML)
    for step, counts in enumerate(histories(Resource.MEMORY, 3, 6)):
        t = np.full(3, (step + 1) * FIVE_MIN)
        out = {}
        for c in (full, no_ml, only_ml):
            states[c], out[c] = update_candidates(c, states[c], counts, t)
        np.testing.assert_array_equal(out[no_ml].value[:, :ml], out[full].value[:, :ml])
        assert np.isnan(out[no_ml].value[:, ml]).all()
        np.testing.assert_array_equal(out[only_ml].value[:, ml], out[full].value[:, ml])
        assert np.isnan(out[only_ml].value[:, :ml]).all()


def test_the_state_round_trips_through_bytes() -> None:
    config = CandidateConfig.for_resource(Resource.MEMORY, SMALL_GRID)
    state = initial_candidate_state(config, 3)
    for step, counts in enumerate(histories(Resource.MEMORY, 3, 4)):
        state, _ = update_candidates(config, state, counts, np.full(3, (step + 1) * FIVE_MIN))
    state, _ = apply_oom(config, state, np.array([np.nan, 9.0 * GIB, np.nan]), np.full(3, 4 * FIVE_MIN + 1))
    restored = CandidateState.from_bytes(state.to_bytes())
    assert restored.equals(state)
    assert [s.jobs for s in restored.split()] == [1, 1, 1]


def test_an_oom_raises_every_memory_recommendation_at_once_and_for_the_next_hour() -> None:
    config = CandidateConfig.for_resource(Resource.MEMORY, SMALL_GRID)
    jobs = 2
    state = initial_candidate_state(config, jobs)
    steps = histories(Resource.MEMORY, jobs, 40, seed=5)  # usage steps up after 20
    for step in range(6):
        state, before = update_candidates(config, state, steps[step], np.full(jobs, (step + 1) * FIVE_MIN))
    limit = before.value[0, BUILTIN_RECOMMENDERS.index(RecommenderKind.MOVING_WINDOW_P98)]
    bumped = oom_bumped_value(config, [limit, 0.0], [limit * 1.01, 0.0])
    assert bumped[0] == pytest.approx(limit * 1.01 * (1 + config.oom_bump))
    assert np.isnan(bumped[1]), "nothing known about the kill: no bump"
    oom_time = 6 * FIVE_MIN + 1000
    state, reaction = apply_oom(config, state, bumped, np.full(jobs, oom_time))
    assert reaction.oom_bumped.tolist() == [True, False]
    assert np.all(reaction.value[0] >= bumped[0])
    np.testing.assert_array_equal(reaction.value[1], before.value[1])
    # The next hour of windows holds at least the bump; the one after no longer does.
    for step in range(6, 18):
        t = (step + 1) * FIVE_MIN
        state, batch = update_candidates(config, state, steps[step], np.full(jobs, t))
        if t < oom_time + 55 * 60_000:
            assert np.all(batch.value[0] >= bumped[0]), step
        if step == 6:
            assert batch.oom_bumped.tolist() == [True, False]
    assert batch.value[0, BUILTIN_RECOMMENDERS.index(RecommenderKind.MOVING_WINDOW_P98)] < bumped[0]
    # S_max saw the bumped sample in the window after the OOM (it stays for N windows).
    assert batch.value[0, BUILTIN_RECOMMENDERS.index(RecommenderKind.MOVING_WINDOW_MAX)] >= bumped[0]


@pytest.mark.parametrize(
    ("statistic", "horizon_windows"),
    [
        (HorizontalStatistic.MAX, 3),
        (HorizontalStatistic.MAX, 12),
        (HorizontalStatistic.P95, 12),
        (HorizontalStatistic.P95, 100),
    ],
    ids=["max-short", "max-hour", "p95-hour", "p95-beyond-history"],
)
def test_usage_signal_is_the_statistic_over_each_jobs_horizon(
    statistic: HorizontalStatistic, horizon_windows: int
) -> None:
    config = UsageSignalConfig(max_horizon_ms=24 * 12 * FIVE_MIN)
    rng = np.random.default_rng(11)
    usage = rng.uniform(100, 5000, (40, 2))
    state = initial_usage_signal(config, 2)
    for step in range(40):
        state, r_s = update_usage_signal(
            config,
            state,
            usage[step],
            np.full(2, step * FIVE_MIN),
            np.full(2, horizon_windows * FIVE_MIN),
            np.array([statistic, statistic]),
        )
        recent = usage[max(0, step - horizon_windows + 1) : step + 1]
        if statistic is HorizontalStatistic.MAX:
            want = recent.max(axis=0)
        else:
            ordered = np.sort(recent, axis=0)
            want = ordered[max(int(np.ceil(len(recent) * 0.95)) - 1, 0)]
        np.testing.assert_allclose(r_s, want)
