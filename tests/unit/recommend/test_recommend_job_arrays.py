"""Per-job state containers: slicing, stacking and the bytes format's error handling."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from cellpilot.autopilot.candidates import CandidateConfig, CandidateState, initial_candidate_state
from cellpilot.recommend.job_arrays import JobArrays
from cellpilot.recommend.ml_ensemble import EnsembleConfig, EnsembleState, ModelGrid, initial_ensemble_state
from cellpilot.recommend.moving_window import WindowConfig, WindowState, initial_window_state
from cellpilot.usage.buckets import Resource

CONFIG = WindowConfig(half_life_ms=1000, peak_samples=3)


def numbered_window_state(jobs: int) -> WindowState:
    state = initial_window_state(jobs, 4, CONFIG)
    return WindowState(
        decayed=np.arange(jobs * 4, dtype=float).reshape(jobs, 4),
        avg_weighted_sum=np.arange(jobs, dtype=float),
        avg_weight=np.ones(jobs),
        peak_ring=state.peak_ring,
        updates=np.arange(jobs, dtype=np.int64),
        last_ms=np.arange(jobs, dtype=np.int64) * 10,
    )


def test_take_concat_and_split_are_inverse() -> None:
    state = numbered_window_state(5)
    parts = [state.take([0, 1]), state.take(slice(2, 5))]
    assert WindowState.concat(parts).equals(state)
    assert WindowState.concat(state.split()).equals(state)
    assert state.take([3]).decayed.tolist() == [[12.0, 13.0, 14.0, 15.0]]
    assert state.jobs == 5
    assert state.nbytes == sum(a.nbytes for a in vars(state).values())


def test_nested_states_round_trip() -> None:
    state = initial_candidate_state(CandidateConfig.for_resource(Resource.CPU), 3)
    assert isinstance(state.hour_max, tuple)  # a tuple of per-recommender rings
    restored = JobArrays.from_bytes(state.to_bytes())
    assert isinstance(restored, CandidateState)
    assert restored.equals(state)
    assert CandidateState.concat([state.take([0]), state.take([1, 2])]).equals(state)


def test_float_nan_and_integer_arrays_survive_bytes() -> None:
    state = initial_ensemble_state(2, 4, EnsembleConfig(grid=ModelGrid.product((0.5,), (0.0, 0.1))))
    restored = EnsembleState.from_bytes(state.to_bytes())
    assert restored.equals(state)
    assert restored.raw_limit.dtype == np.int32
    assert restored.raw_limit.flags.writeable


@pytest.mark.parametrize(
    ("mangle", "error"),
    [
        (lambda b: b"XXXX" + b[4:], ValueError),
        (lambda b: b[:-8], ValueError),
        (lambda b: b + b"\0", ValueError),
        (lambda b: b[:3], ValueError),
    ],
    ids=["bad-magic", "truncated", "trailing-bytes", "too-short"],
)
def test_corrupt_bytes_are_rejected(mangle: Callable[[bytes], bytes], error: type[Exception]) -> None:
    data = numbered_window_state(2).to_bytes()
    with pytest.raises(error):
        WindowState.from_bytes(mangle(data))


def test_bytes_of_another_state_type_are_rejected() -> None:
    data = numbered_window_state(1).to_bytes()
    with pytest.raises(TypeError):
        EnsembleState.from_bytes(data)


def test_inconsistent_job_counts_are_detected() -> None:
    state = numbered_window_state(2)
    broken = WindowState(
        state.decayed,
        state.avg_weighted_sum[:1],
        state.avg_weight,
        state.peak_ring,
        state.updates,
        state.last_ms,
    )
    with pytest.raises(ValueError):
        WindowState.from_bytes(broken.to_bytes())
