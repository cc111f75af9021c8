"""Borglet reports diffed into task transitions; missed polls; duplicates after a machine returns."""

from __future__ import annotations

import pytest
from borg_builders import Master, job_spec, machine_spec

from cellpilot.borg.decisions import SubmitJob
from cellpilot.borg.lifecycle import JobState, TaskEvent, TaskState
from cellpilot.borg.model import MachineAvailability
from cellpilot.borg.mutations import MachineStateChanged, TaskStateChanged
from cellpilot.borg.poll_diff import (
    DEFAULT_MAX_FAILURES,
    MachineReport,
    ReportedEvent,
    ReportedTask,
    desired_tasks,
    diff_report,
    machines_down,
)
from cellpilot.borg.records import TaskIncarnation
from cellpilot.job_vocabulary import PriorityBand
from cellpilot.schedule import Resources
from cellpilot.units import GIB


def _one_running_task() -> tuple[Master, str, int]:
    master = Master()
    master.add_machines(machine_spec("m0"), machine_spec("m1"))
    master.grant("alice", PriorityBand.PRODUCTION)
    master.accept(SubmitJob("s", job_spec(task_count=1)))
    master.schedule()
    task = master.state.jobs["alice/web"].tasks[0]
    return master, task.machine_id, task.incarnation


def _report(
    machine: str, version: int, *tasks: ReportedTask, events: tuple[ReportedEvent, ...] = ()
) -> MachineReport:
    return MachineReport(machine, 2_000_000, version, tasks, events)


@pytest.mark.parametrize(
    ("reported_state", "exit_reason", "expected_state", "expected_reason"),
    [
        (TaskState.RUNNING, None, TaskState.RUNNING, TaskEvent.RUNNING),
        (TaskState.DEAD, TaskEvent.FINISHED, TaskState.DEAD, TaskEvent.FINISHED),
        (TaskState.DEAD, TaskEvent.OOM, TaskState.PENDING, TaskEvent.OOM),
        (TaskState.DEAD, TaskEvent.FAILED, TaskState.PENDING, TaskEvent.FAILED),
        (TaskState.DEAD, TaskEvent.KILLED, TaskState.PENDING, TaskEvent.EVICTED),
        (TaskState.DEAD, None, TaskState.PENDING, TaskEvent.FAILED),
    ],
    ids=["started", "finished", "oom", "failed-rescheduled", "killed-locally", "unknown-exit"],
)
def test_a_report_of_the_current_incarnation_moves_the_task(
    reported_state: TaskState,
    exit_reason: TaskEvent | None,
    expected_state: TaskState,
    expected_reason: TaskEvent,
) -> None:
    master, machine, incarnation = _one_running_task()
    version = master.state.machines[machine].desired_version
    reported = ReportedTask("alice/web", 0, incarnation, reported_state, exit_reason, exit_code=3)
    diff = diff_report(master.state, _report(machine, version, reported))
    (mutation,) = diff.mutations
    assert isinstance(mutation, TaskStateChanged)
    assert (mutation.state, mutation.reason) == (expected_state, expected_reason)
    master.commit(diff.mutations)
    task = master.state.jobs["alice/web"].tasks[0]
    assert task.state is expected_state
    if expected_state is TaskState.RUNNING:
        assert diff_report(master.state, _report(machine, version, reported)).mutations == (), "reported once"
    if expected_reason is TaskEvent.FINISHED:
        assert master.state.jobs["alice/web"].state is JobState.DEAD


def test_an_oom_carries_the_usage_at_the_kill_from_the_borglet_event() -> None:
    master, machine, incarnation = _one_running_task()
    at_kill = Resources(900, 1.5 * GIB)
    event = ReportedEvent(7, "alice/web", 0, incarnation, TaskEvent.OOM, "memory 1.5 GiB over 1 GiB", at_kill)
    reported = ReportedTask("alice/web", 0, incarnation, TaskState.DEAD, TaskEvent.OOM)
    diff = diff_report(master.state, _report(machine, 0, reported, events=(event,)))
    (mutation,) = diff.mutations
    assert isinstance(mutation, TaskStateChanged)
    assert mutation.usage == at_kill
    assert mutation.detail == "memory 1.5 GiB over 1 GiB"
    changes = master.commit(diff.mutations)
    oom = [c for c in changes if getattr(c, "kind", None) is TaskEvent.OOM]
    assert oom[0].usage == at_kill


@pytest.mark.parametrize(
    ("failures", "restarts", "given_up"),
    [(DEFAULT_MAX_FAILURES, 0, True), (DEFAULT_MAX_FAILURES - 1, 0, False), (0, 50, False)],
    ids=["failing-in-a-row", "one-more-try", "often-moved-never-failed"],
)
def test_a_task_failing_too_often_in_a_row_is_given_up(failures: int, restarts: int, given_up: bool) -> None:
    """Only the task's own failures in a row count: preemptions, evictions and losses do not."""
    master, machine, incarnation = _one_running_task()
    task = master.state.jobs["alice/web"].tasks[0]
    task.failures, task.restarts = failures, restarts
    reported = ReportedTask("alice/web", 0, incarnation, TaskState.DEAD, TaskEvent.FAILED)
    (mutation,) = diff_report(master.state, _report(machine, 0, reported)).mutations
    assert isinstance(mutation, TaskStateChanged)
    expected = (
        (TaskState.DEAD, TaskEvent.FAILED_FOR_GOOD) if given_up else (TaskState.PENDING, TaskEvent.FAILED)
    )
    assert (mutation.state, mutation.reason) == expected


@pytest.mark.parametrize(
    ("version_offset", "lost"),
    [(0, True), (5, True), (-1, False)],
    ids=["applied-our-version", "newer-version", "not-yet-applied"],
)
def test_a_task_missing_from_a_report_is_lost_only_once_the_borglet_has_our_set(
    version_offset: int, lost: bool
) -> None:
    master, machine, _ = _one_running_task()
    version = master.state.machines[machine].desired_version + version_offset
    diff = diff_report(master.state, _report(machine, version))
    if lost:
        (mutation,) = diff.mutations
        assert isinstance(mutation, TaskStateChanged)
        assert mutation.reason is TaskEvent.LOST
    else:
        assert diff.mutations == ()


@pytest.mark.parametrize(
    ("where", "incarnation_delta"),
    [("other-machine", 0), ("same-machine", -1)],
    ids=["not-assigned-here", "older-incarnation"],
)
def test_duplicates_are_reported_and_change_nothing(where: str, incarnation_delta: int) -> None:
    master, machine, incarnation = _one_running_task()
    other = "m1" if machine == "m0" else "m0"
    target = other if where == "other-machine" else machine
    reported = ReportedTask("alice/web", 0, incarnation + incarnation_delta, TaskState.RUNNING)
    diff = diff_report(master.state, _report(target, 0, reported))
    assert diff.duplicates == (TaskIncarnation("alice/web", 0, incarnation + incarnation_delta),)
    assert not [m for m in diff.mutations if isinstance(m, TaskStateChanged) and m.job_id == "alice/web"]


def test_a_machine_missing_polls_goes_down_its_tasks_are_rescheduled_and_return_means_duplicates() -> None:
    master, machine, incarnation = _one_running_task()
    assert machines_down(master.state, {machine: 2}, threshold=3) == []
    (down,) = machines_down(master.state, {machine: 3}, threshold=3)
    assert isinstance(down, MachineStateChanged)
    assert down.state is MachineAvailability.DOWN
    changes = master.commit([down])
    lost = [c for c in changes if getattr(c, "kind", None) is TaskEvent.LOST]
    assert [(c.job_id, c.task_index) for c in lost] == [("alice/web", 0)]
    assert desired_tasks(master.state, machine) == []
    master.schedule()
    moved = master.state.jobs["alice/web"].tasks[0]
    assert moved.state is TaskState.RUNNING
    assert moved.machine_id != machine
    assert moved.incarnation == incarnation + 1
    # The machine answers again, still running the old incarnation: it is a duplicate.
    old = ReportedTask("alice/web", 0, incarnation, TaskState.RUNNING)
    diff = diff_report(master.state, _report(machine, 0, old))
    assert isinstance(diff.mutations[0], MachineStateChanged)
    assert diff.mutations[0].state is MachineAvailability.UP
    assert diff.duplicates == (TaskIncarnation("alice/web", 0, incarnation),)
    master.commit(diff.mutations)
    assert master.state.machines[machine].availability is MachineAvailability.UP


@pytest.mark.parametrize(("started_ms", "sampled"), [(1_990_000, True), (1_999_000, False), (0, True)])
def test_a_running_task_reports_a_cpu_demand_sample_of_served_plus_unmet(
    started_ms: int, sampled: bool
) -> None:
    master, machine, incarnation = _one_running_task()
    version = master.state.machines[machine].desired_version
    reported = ReportedTask(
        "alice/web",
        0,
        incarnation,
        TaskState.RUNNING,
        usage=Resources(700, GIB // 2),
        started_ms=started_ms,
        cpu_unmet_millicores=300.0,
    )
    diff = diff_report(master.state, _report(machine, version, reported))
    # Before its first full sample (2 s after the start at the report's 2_000_000 ms) a task reads 0.
    assert diff.cpu_demand == ({("alice/web", 0): 1000.0} if sampled else {})
