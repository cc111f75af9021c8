"""The Borglet's per-machine logic (:mod:`cellpilot.borglet`): converging on the master's desired
set, the machine's fence, its unacknowledged events and forgetting settled tasks."""

from __future__ import annotations

import pytest
from borglet_plan_builders import task_plan

from cellpilot.borg.lifecycle import TaskEvent, TaskState
from cellpilot.borglet.desired_set import KnownTask, diff_desired
from cellpilot.borglet.hosted_task import HostedTask, Limits, TaskPlan
from cellpilot.borglet.machine_agent import MachineAgent, MachineProfile
from cellpilot.borglet.task_lifecycle import Phase

# ----- desired set ---------------------------------------------------------------------------

K = KnownTask
DIFF_CASES = [
    ([], [task_plan()], [], [("u/j", 0)], []),
    ([K(("u/j", 0), 1, 1, True)], [], [("u/j", 0)], [], []),
    ([K(("u/j", 0), 1, 1, True)], [task_plan()], [], [], []),
    ([K(("u/j", 0), 1, 1, True)], [task_plan(incarnation=2)], [("u/j", 0)], [("u/j", 0)], []),
    ([K(("u/j", 0), 1, 1, True)], [task_plan(spec_version=2)], [], [], [("u/j", 0)]),
    ([K(("u/j", 0), 1, 1, False)], [task_plan()], [], [], []),
    ([K(("u/j", 0), 1, 1, False)], [], [], [], []),
    ([K(("u/j", 0), 1, 1, False)], [task_plan(incarnation=2)], [], [("u/j", 0)], []),
]


@pytest.mark.parametrize(
    ("known", "desired", "kill", "start", "update"),
    DIFF_CASES,
    ids=[
        "new-task-started",
        "undesired-duplicate-killed",
        "same-incarnation-untouched",
        "newer-incarnation-replaces",
        "spec-change-updated-in-place",
        "dead-same-incarnation-stays-dead",
        "dead-undesired-left-alone",
        "dead-then-new-incarnation-started",
    ],
)
def test_desired_set_diff(
    known: list[KnownTask],
    desired: list[TaskPlan],
    kill: list[tuple[str, int]],
    start: list[tuple[str, int]],
    update: list[tuple[str, int]],
) -> None:
    changes = diff_desired(known, desired)
    assert [k.key for k in changes.kill] == kill
    assert [p.key for p in changes.start] == start
    assert [p.key for p in changes.update] == update


def test_desired_set_naming_a_task_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="twice"):
        diff_desired([], [task_plan(), task_plan(incarnation=2)])


# ----- machine agent: fencing, events, forgetting ----------------------------------------------


def _agent(max_events: int = 100) -> MachineAgent:
    profile = MachineProfile("m1", Limits(1000, 1 << 30), {}, "r", "p", 20000)
    return MachineAgent(profile, 0, first_sequence=5000, max_unacked_events=max_events)


def test_fence_refuses_older_epochs_and_remembers_newer() -> None:
    agent = _agent()
    assert agent.admit_epoch(3) is None
    assert agent.admit_epoch(3) is None
    refusal = agent.admit_epoch(2)
    assert refusal is not None
    assert "2" in refusal
    assert "3" in refusal
    assert agent.admit_epoch(7) is None
    assert agent.admit_epoch(3) is not None


def test_events_are_kept_until_acknowledged_and_dead_tasks_forgotten_after() -> None:
    agent = _agent()
    record = HostedTask("m1", task_plan(), Phase.RUNNING, started_ms=0)
    agent.tasks[record.plan.key] = record
    started = agent.record_event(record, TaskEvent.RUNNING, 10, "c1")
    record.phase = Phase.DEAD
    died = agent.record_event(record, TaskEvent.OOM, 20, "c2", "over")
    record.exit_sequence = died.sequence
    assert (started.sequence, died.sequence) == (5000, 5001)
    assert died.state is TaskState.PENDING  # an OOM-killed task is rescheduled (Figure 2)
    agent.acknowledge(5000)
    agent.forget_settled()
    assert [e.sequence for e in agent.events] == [5001]
    assert record.plan.key in agent.tasks  # its exit is not acknowledged yet
    agent.desired = {record.plan.key: 1}
    agent.acknowledge(5001)
    agent.forget_settled()
    assert not agent.events
    assert record.plan.key in agent.tasks  # still named by the desired set
    agent.desired = {}
    agent.forget_settled()
    assert record.plan.key not in agent.tasks


def test_unacknowledged_events_are_bounded() -> None:
    agent = _agent(max_events=3)
    record = HostedTask("m1", task_plan(), Phase.RUNNING, started_ms=0)
    for t in range(5):
        agent.record_event(record, TaskEvent.RUNNING, t, "c")
    assert [e.event_time_ms for e in agent.events] == [2, 3, 4]
    assert agent.dropped_events == 2
