"""The actuator's admission check, the master's hold rule and its memory's bytes form."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from cellpilot.autopilot.actuation_guard import ActuationGuard, Admission
from cellpilot.autopilot.decisions import (
    JobMemory,
    JobView,
    SentTarget,
    hold_release_ready,
)
from cellpilot.autopilot.job_memory_codec import decode_memory, encode_memory
from cellpilot.autopilot.selection import VerticalConfig
from cellpilot.job_vocabulary import ScalingMode
from cellpilot.recommend.horizontal import (
    HorizontalReason,
    StabiliserConfig,
    initial_stabiliser_state,
    stabilise,
)


@pytest.mark.parametrize(
    ("settled", "highest", "token", "expected"),
    [
        pytest.param(False, 0, 1, Admission.APPLY, id="first-token"),
        pytest.param(False, 5, 5, Admission.APPLY, id="same-leader"),
        pytest.param(False, 5, 7, Admission.APPLY, id="newer-leader"),
        pytest.param(False, 5, 4, Admission.FENCED, id="deposed-leader"),
        pytest.param(True, 5, 5, Admission.DUPLICATE, id="replay"),
        pytest.param(True, 5, 4, Admission.DUPLICATE, id="replay-of-old-decision"),
    ],
)
def test_admission(settled: bool, highest: int, token: int, expected: Admission) -> None:
    guard = ActuationGuard()
    guard.accept_token(highest)
    if settled:
        guard.settle("k", "applied")
    assert guard.admit("k", token) is expected


def test_guard_never_lowers_its_token_and_forgets_oldest_keys() -> None:
    guard = ActuationGuard(remember_keys=2)
    guard.accept_token(9)
    guard.accept_token(3)
    assert guard.highest_token == 9
    for key in ("a", "b", "c"):
        guard.settle(key, "applied")
    assert guard.outcome_of("a") is None
    assert guard.outcome_of("c") == "applied"


ON = VerticalConfig(ScalingMode.ON)
DRY = VerticalConfig(ScalingMode.DRY_RUN)


@pytest.mark.parametrize(
    ("held", "cpu", "has_rec", "held_for", "expected"),
    [
        pytest.param(False, ON, True, 0, False, id="not-held"),
        pytest.param(True, ON, False, 1_000, False, id="waits-for-first-recommendation"),
        pytest.param(True, ON, True, 0, True, id="first-recommendation"),
        pytest.param(True, ON, False, 30_000, True, id="grace-over"),
        pytest.param(True, DRY, False, 0, True, id="dry-run-waits-for-nothing"),
    ],
)
def test_hold_release(held: bool, cpu: VerticalConfig, has_rec: bool, held_for: int, expected: bool) -> None:
    job = JobView("u/j", 1, 500.0, 1e9, 2, cpu=cpu, held=held)
    assert hold_release_ready(job, has_rec, held_for, 30_000) is expected


def test_memory_round_trips_with_stabiliser_state() -> None:
    config = StabiliserConfig()
    state, _ = stabilise(
        config, initial_stabiliser_state(1, config), np.array([5.0]), np.array([2]), np.array([600_000])
    )
    memory = JobMemory(
        cpu=SentTarget(700.0, 600_000, "u/j/1/abc"),
        tasks=SentTarget(5.0, 600_000, "u/j/1/def"),
        stabiliser=state,
        stabiliser_slots=config.deferred_downscaling.slots if config.deferred_downscaling else 1,
        horizontal_input_ms=600_000,
        horizontal_target=5,
        horizontal_raw=5.0,
        horizontal_reason=HorizontalReason.GROWTH_LIMITED,
    )
    back = decode_memory(encode_memory(memory))
    assert back.stabiliser is not None
    assert np.array_equal(back.stabiliser.deferred.slot_ids, state.deferred.slot_ids)
    assert replace(back, stabiliser=None) == replace(memory, stabiliser=None)
    assert decode_memory(encode_memory(JobMemory())) == JobMemory()
    with pytest.raises(ValueError, match="truncated"):
        decode_memory(b"\x01")


def test_a_newer_decision_on_a_version_its_own_predecessor_replaced_goes_onto_the_chain() -> None:
    guard = ActuationGuard()
    # Two decisions made on version 2 before the first reached the Borgmaster.
    assert guard.expected_version("u/j", 2) == 2
    guard.applied("u/j", 2, 3)
    assert guard.expected_version("u/j", 2) == 3
    guard.applied("u/j", 3, 4)
    # A third decision on 2 or on 3 (all replaced by this actuator's own updates) expects 4.
    assert guard.expected_version("u/j", 2) == 4
    assert guard.expected_version("u/j", 3) == 4
    # A decision on the latest version, on one older than the chain, or on another job: unchanged.
    assert guard.expected_version("u/j", 4) == 4
    assert guard.expected_version("u/j", 1) == 1
    assert guard.expected_version("u/other", 2) == 2
    assert guard.expected_version("u/j", 0) == 0  # no check asked for: none made


def test_a_change_made_by_someone_else_starts_a_new_chain() -> None:
    guard = ActuationGuard()
    guard.applied("u/j", 2, 3)
    # A user edited the job (3 -> 4); the master then decided on 4.
    guard.applied("u/j", 4, 5)
    assert guard.expected_version("u/j", 4) == 5
    # Versions before the user's edit are not this actuator's chain: the Borgmaster refuses them.
    assert guard.expected_version("u/j", 2) == 2
    assert guard.expected_version("u/j", 3) == 3
    # An unchecked update proves nothing about the chain.
    guard.applied("u/j", 0, 6)
    assert guard.expected_version("u/j", 4) == 4


def test_chains_are_forgotten_oldest_first() -> None:
    guard = ActuationGuard(remember_jobs=2)
    for job in ("a", "b", "c"):
        guard.applied(job, 1, 2)
    assert guard.expected_version("a", 1) == 1
    assert guard.expected_version("c", 1) == 2
