"""A recommender kind is one estimator plus one registration, and comes out of the batch path.

The toy kind below (half the peak of the job's newest window, with the safety margin and
the hour's max: a "half peak" recommender) is registered here, in this test only, and nowhere else: the
worker's batch step, its OOM reaction and its state bytes carry it in an eighth column
without any other change, and the seven built-in columns stay exactly what they were.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pytest

from cellpilot.autopilot.candidates import (
    CandidateConfig,
    CandidateState,
    apply_oom,
    initial_candidate_state,
    update_candidates,
)
from cellpilot.autopilot.job_recommendations import (
    HistogramInput,
    RecommenderConfig,
    RecommenderState,
    apply_histograms,
)
from cellpilot.autopilot.recommender_registry import (
    BUILTIN_RECOMMENDERS,
    BUILTIN_REGISTRY,
    RecommenderRegistration,
)
from cellpilot.job_vocabulary import RecommenderKind
from cellpilot.recommend.estimator import Estimate, Estimator, SharedSource, SharedView, WithMargin
from cellpilot.recommend.moving_window import highest_nonempty
from cellpilot.units import GIB
from cellpilot.usage.buckets import Resource

FIVE_MIN = 300_000
TOY = "half_peak"


@dataclass(frozen=True)
class HalfPeak:
    """The toy kind's estimator: half the highest bucket of the newest window (no shared state)."""

    @property
    def reads(self) -> frozenset[SharedSource]:
        return frozenset()

    def estimate(self, view: SharedView) -> Estimate:
        peak = highest_nonempty(view.counts)
        half = np.where(peak >= 0, 0.5 * view.boundaries[np.maximum(peak, 0)], np.nan)
        return Estimate(raw=half, limit=half, margin=np.zeros_like(half))


def _half_peak_with_margin(config: CandidateConfig) -> Estimator:
    return WithMargin(HalfPeak(), config.margin)


# The one place the toy kind is registered.
TOY_REGISTRY = BUILTIN_REGISTRY.registered(
    RecommenderRegistration(TOY, _half_peak_with_margin, "0.5*S_max", "half the peak (a test's toy)")
)


def with_toy(config: CandidateConfig) -> CandidateConfig:
    return replace(config, registry=TOY_REGISTRY)


def histograms(config: CandidateConfig, jobs: int, steps: int) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    level = rng.uniform(0.5, 6.0, jobs) * GIB
    out = []
    for step in range(steps):
        values = level[:, None] * rng.lognormal(0.0, 0.3, (jobs, 12)) * (0.5 if step > steps // 2 else 1.0)
        counts = np.zeros((jobs, config.scheme.size))
        for j in range(jobs):
            np.add.at(counts[j], config.scheme.index_of(values[j]), 1.0)
        out.append(counts)
    return out


def config_peak(config: CandidateConfig, counts: np.ndarray) -> np.ndarray:
    """The highest non-empty bucket's boundary of each job's window, computed independently."""
    return np.asarray([config.scheme.boundaries[np.flatnonzero(row).max()] for row in counts])


def test_a_kind_registered_in_one_place_comes_out_of_the_batch_step_beside_the_built_ins() -> None:
    builtin = CandidateConfig.for_resource(Resource.MEMORY)
    toy = with_toy(builtin)
    column = TOY_REGISTRY.column(TOY)
    assert column == len(BUILTIN_RECOMMENDERS)
    jobs, steps = 3, 30
    state, toy_state = initial_candidate_state(builtin, jobs), initial_candidate_state(toy, jobs)
    held_up = False
    for step, counts in enumerate(histograms(builtin, jobs, steps)):
        t = np.full(jobs, (step + 1) * FIVE_MIN, dtype=np.int64)
        state, batch = update_candidates(builtin, state, counts, t)
        toy_state, toy_batch = update_candidates(toy, toy_state, counts, t)
        assert toy_batch.value.shape == (jobs, len(BUILTIN_RECOMMENDERS) + 1)
        # The built-in columns are untouched by the new kind.
        np.testing.assert_array_equal(toy_batch.value[:, :column], batch.value)
        np.testing.assert_array_equal(toy_batch.raw_value[:, :column], batch.raw_value)
        # The toy's estimate reads the window the batch step was given, and gets the safety margin.
        peak = config_peak(builtin, counts)
        np.testing.assert_array_equal(toy_batch.raw_value[:, column], 0.5 * peak)
        expected_limit, expected_margin = builtin.margin.apply(toy_batch.raw_value[:, column])
        np.testing.assert_array_equal(toy_batch.margin[:, column], expected_margin)
        # ... and is held at its own max over the last hour (§3.2.2) once usage halves.
        assert np.all(toy_batch.value[:, column] >= expected_limit)
        held_up |= bool(toy_batch.raised_by_window_max[:, column].any())
    assert held_up, "usage halved: the hour's max must have held the toy's value up at least once"


def test_the_new_kind_reacts_to_an_oom_and_its_state_round_trips_through_bytes() -> None:
    config = with_toy(CandidateConfig.for_resource(Resource.MEMORY))
    column = TOY_REGISTRY.column(TOY)
    state = initial_candidate_state(config, 2)
    for step, counts in enumerate(histograms(config, 2, 4)):
        state, _ = update_candidates(config, state, counts, np.full(2, (step + 1) * FIVE_MIN))
    bump = 100.0 * GIB
    state, reaction = apply_oom(config, state, np.array([bump, np.nan]), np.full(2, 4 * FIVE_MIN + 1))
    assert reaction.value[0, column] >= bump
    assert reaction.value[1, column] < bump
    assert CandidateState.from_bytes(state.to_bytes()).equals(state)


def test_the_worker_publishes_the_new_kind_with_no_change_to_its_code() -> None:
    config = RecommenderConfig(
        cpu=with_toy(CandidateConfig.for_resource(Resource.CPU)),
        memory=with_toy(CandidateConfig.for_resource(Resource.MEMORY)),
    )
    inputs = [
        HistogramInput("j", resource, (k + 1) * FIVE_MIN, counts[0], 1.0)
        for resource in (Resource.CPU, Resource.MEMORY)
        for k, counts in enumerate(histograms(config.for_resource(resource), 1, 3))
    ]
    states: dict[str, RecommenderState] = {}
    result = apply_histograms(config, states, inputs)
    assert len(result.ready) == 3
    for resource in (Resource.CPU, Resource.MEMORY):
        row = states["j"].rows[resource]
        assert row.value.shape == (len(TOY_REGISTRY),)
        assert not np.isnan(row.value[TOY_REGISTRY.column(TOY)])
    restored = RecommenderState.from_bytes(states["j"].to_bytes())
    assert restored.memory.equals(states["j"].memory)


def test_a_kind_is_registered_once_and_every_built_in_kind_is_registered() -> None:
    with pytest.raises(ValueError, match="registered twice"):
        TOY_REGISTRY.registered(TOY_REGISTRY.registrations[-1])
    not_recommenders = {RecommenderKind.UNSPECIFIED, RecommenderKind.AUTO, RecommenderKind.CUSTOM}
    assert set(BUILTIN_RECOMMENDERS) == set(RecommenderKind) - not_recommenders


def test_a_caller_that_skips_the_window_state_skips_only_the_kinds_that_read_it() -> None:
    config = replace(with_toy(CandidateConfig.for_resource(Resource.MEMORY)), with_window=False)
    ml, toy = BUILTIN_REGISTRY.column(RecommenderKind.ML), TOY_REGISTRY.column(TOY)
    assert config.computed_columns == (ml, toy)
    state = initial_candidate_state(config, 2)
    state, batch = update_candidates(config, state, histograms(config, 2, 1)[0], np.full(2, FIVE_MIN))
    assert np.isnan(np.delete(batch.value, [ml, toy], axis=1)).all()
    assert not np.isnan(batch.value[:, toy]).any()
