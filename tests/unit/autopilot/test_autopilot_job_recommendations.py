"""The recommender worker's per-job state: batched == sequential, no double apply, bytes, OOMs."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from cellpilot.autopilot.job_recommendations import (
    HistogramInput,
    OomInput,
    RecommenderConfig,
    RecommenderState,
    apply_histograms,
    apply_ooms,
)
from cellpilot.units import GIB
from cellpilot.usage.buckets import Resource

W = 300_000
CONFIG = RecommenderConfig()


def window(job: str, resource: Resource, k: int, level: float) -> HistogramInput:
    scheme = CONFIG.for_resource(resource).scheme
    rng = np.random.default_rng(k * 7 + len(job))
    values = level * rng.lognormal(0.0, 0.2, 30)
    counts = np.zeros(scheme.size)
    np.add.at(counts, scheme.index_of(values), 1.0)
    return HistogramInput(job, resource, (k + 1) * W, counts, float(values.mean()) * 3)


def stream(jobs: dict[str, float], windows: int) -> list[HistogramInput]:
    return [
        window(job, resource, k, level * 1000.0 if resource is Resource.CPU else level * GIB)
        for k in range(windows)
        for job, level in jobs.items()
        for resource in (Resource.CPU, Resource.MEMORY)
    ]


def same(a: RecommenderState, b: RecommenderState) -> bool:
    rows_equal = all(
        np.array_equal(a.rows[r].value, b.rows[r].value, equal_nan=True)
        for r in (Resource.CPU, Resource.MEMORY)
    )
    return a.cpu.equals(b.cpu) and a.memory.equals(b.memory) and a.signal.equals(b.signal) and rows_equal


def test_one_batch_equals_one_window_at_a_time_and_a_resent_window_is_not_applied_twice() -> None:
    inputs = stream({"a": 0.5, "b": 2.0, "c": 1.0}, windows=6)
    batched: dict[str, RecommenderState] = {}
    result = apply_histograms(CONFIG, batched, inputs)
    assert result.applied == len(inputs)
    assert result.skipped == 0
    assert [(job, end) for job, end, _ in result.ready] == [(j, (k + 1) * W) for k in range(6) for j in "abc"]
    one_by_one: dict[str, RecommenderState] = {}
    for item in inputs:
        apply_histograms(CONFIG, one_by_one, [item])
    for job in ("a", "b", "c"):
        assert same(batched[job], one_by_one[job])
    before = {job: state.to_bytes() for job, state in batched.items()}
    again = apply_histograms(CONFIG, batched, inputs[-6:])  # the outbox re-sends the last window
    assert again.applied == 0
    assert again.skipped == 6
    assert {job: state.to_bytes() for job, state in batched.items()} == before


def test_the_state_round_trips_through_bytes_and_publishes_once_both_resources_are_in() -> None:
    states: dict[str, RecommenderState] = {}
    first = apply_histograms(CONFIG, states, [window("j", Resource.CPU, 0, 1000.0)])
    assert first.ready == []  # the memory histogram of the window is not in yet
    second = apply_histograms(CONFIG, states, [window("j", Resource.MEMORY, 0, GIB)])
    state = states["j"]
    assert [(job, end) for job, end, _ in second.ready] == [("j", W)]
    assert state.published_end_ms == W
    restored = RecommenderState.from_bytes(state.to_bytes())
    assert same(state, restored)
    assert restored.usage_statistic == state.usage_statistic
    assert restored.rows[Resource.CPU].ml_model == state.rows[Resource.CPU].ml_model


def test_an_oom_raises_every_memory_recommendation_above_the_killed_limit() -> None:
    states: dict[str, RecommenderState] = {}
    apply_histograms(CONFIG, states, stream({"j": 1.0}, windows=3))
    before = states["j"].rows[Resource.MEMORY].value.copy()
    cpu_before = states["j"].rows[Resource.CPU].value.copy()
    limit = float(np.nanmax(before))
    changed = apply_ooms(CONFIG, states, [OomInput("j", 3 * W + 10, limit, limit * 1.05)])
    after = states["j"].rows[Resource.MEMORY]
    assert changed == {"j"}
    assert after.oom_bumped
    assert np.all(after.value >= limit * 1.05 * (1 + CONFIG.memory.oom_bump) - 1)
    assert np.array_equal(states["j"].rows[Resource.CPU].value, cpu_before)  # CPU is not touched


def test_the_stored_bytes_are_those_of_format_2_as_saved_before() -> None:
    """A worker's state saved in Redis (format 2) reads back, and the same inputs build the very
    same bytes: ``data/recommender_state_format2.bin.gz`` was written from ``stream({"j": 1.0}, 3)``."""
    saved = gzip.decompress(
        (Path(__file__).parent / "data" / "recommender_state_format2.bin.gz").read_bytes()
    )
    states: dict[str, RecommenderState] = {}
    apply_histograms(CONFIG, states, stream({"j": 1.0}, windows=3))
    assert states["j"].to_bytes() == saved
    restored = RecommenderState.from_bytes(saved)
    assert same(restored, states["j"])
    assert restored.to_bytes() == saved
