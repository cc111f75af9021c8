"""The transition tables of Borg Figure 2, checked edge by edge and for their invariants."""

from __future__ import annotations

import pytest

from cellpilot.borg.lifecycle import (
    JOB_TRANSITIONS,
    MACHINE_TRANSITIONS,
    TASK_TRANSITIONS,
    JobEvent,
    JobState,
    MachineEvent,
    MachineState,
    TaskEvent,
    TaskState,
    transition,
)

P, R, D = TaskState.PENDING, TaskState.RUNNING, TaskState.DEAD


@pytest.mark.parametrize(
    ("state", "event", "expected"),
    [
        (P, TaskEvent.SCHEDULED, R),
        (P, TaskEvent.KILLED, D),
        (R, TaskEvent.EVICTED, P),
        (R, TaskEvent.PREEMPTED, P),
        (R, TaskEvent.OOM, P),
        (R, TaskEvent.LOST, P),
        (R, TaskEvent.FAILED, P),
        (R, TaskEvent.FINISHED, D),
        (R, TaskEvent.KILLED, D),
        (D, TaskEvent.SUBMITTED, P),
    ],
    ids=lambda v: v.value if hasattr(v, "value") else str(v),
)
def test_figure_2_task_edges(state: TaskState, event: TaskEvent, expected: TaskState) -> None:
    result = transition(TASK_TRANSITIONS, state, event)
    assert result.allowed
    assert result.state is expected


@pytest.mark.parametrize(
    ("state", "event"),
    [(P, TaskEvent.FINISHED), (P, TaskEvent.PREEMPTED), (D, TaskEvent.SCHEDULED), (D, TaskEvent.KILLED)],
    ids=["pending-cannot-finish", "pending-cannot-be-preempted", "dead-cannot-run", "dead-cannot-die-twice"],
)
def test_illegal_task_events_are_results_that_keep_the_state(state: TaskState, event: TaskEvent) -> None:
    result = transition(TASK_TRANSITIONS, state, event)
    assert not result.allowed
    assert result.state is state
    assert event.value in result.reason
    assert state.value in result.reason


def test_only_a_resubmission_leaves_dead_and_every_state_can_be_killed_or_is_dead() -> None:
    assert set(TASK_TRANSITIONS[D]) == {TaskEvent.SUBMITTED}
    for state in (P, R):
        assert TASK_TRANSITIONS[state][TaskEvent.KILLED] is D
    for state in JobState:
        assert state is JobState.DEAD or JOB_TRANSITIONS[state][JobEvent.KILLED] is JobState.DEAD


def test_every_table_covers_every_state_and_targets_known_states() -> None:
    for table, states in (
        (TASK_TRANSITIONS, TaskState),
        (JOB_TRANSITIONS, JobState),
        (MACHINE_TRANSITIONS, MachineState),
    ):
        assert set(table) == set(states)
        for edges in table.values():  # type: ignore[attr-defined]
            assert set(edges.values()) <= set(states)


def test_a_held_job_runs_only_after_release() -> None:
    held = JobState.HELD_FOR_AUTOPILOT
    assert not transition(JOB_TRANSITIONS, held, JobEvent.TASK_STARTED).allowed
    assert transition(JOB_TRANSITIONS, held, JobEvent.RELEASED).state is JobState.PENDING


def test_a_down_machine_comes_back_up_when_it_answers() -> None:
    down = transition(MACHINE_TRANSITIONS, MachineState.UP, MachineEvent.POLLS_MISSED).state
    assert down is MachineState.DOWN
    assert transition(MACHINE_TRANSITIONS, down, MachineEvent.POLL_ANSWERED).state is MachineState.UP
