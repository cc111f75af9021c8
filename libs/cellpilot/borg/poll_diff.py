"""Borglet polls, as the master sees them: full-state reports diffed into task transitions.

Borg §3.3: the Borgmaster polls each Borglet every few seconds; the Borglet always
reports its full state and the master keeps only the differences for its state machines.
A machine that misses several polls is marked down and its tasks are rescheduled; when it
answers again, the master tells it to kill the tasks that were rescheduled elsewhere.

:func:`diff_report` turns one report into mutations (task started, exited, OOM-killed,
missing) and lists the duplicates: tasks the Borglet runs with an older incarnation, or
that are not assigned to that machine at all. :func:`machines_down` marks machines down
after ``threshold`` consecutive missed polls. :func:`desired_tasks` is the set of tasks
the master wants on a machine, sent with each poll (its version is the log position of
its last change, so it grows across failovers too).

A task's own failure (OOM, error exit, failure to start) carries its restart decision
(:func:`cellpilot.borg.restart_backoff.restart_backoff`): when it may run again and which
machine it avoids. A task missing from a report, or on a machine that went down, is LOST:
not its fault, so it is rescheduled at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from cellpilot.borg.cell_state import CellState, JobRecord, TaskRecord
from cellpilot.borg.lifecycle import MachineState, TaskEvent, TaskState
from cellpilot.borg.model import MachineAvailability
from cellpilot.borg.mutations import MachineStateChanged, Mutation, TaskStateChanged
from cellpilot.borg.records import TaskIncarnation
from cellpilot.borg.restart_backoff import FAILURE_EVENTS, RestartPolicy, restart_backoff
from cellpilot.schedule import Resources

# A task that exits with an error more often than this in a row is given up (FAILED -> DEAD).
DEFAULT_MAX_FAILURES = 10
DEFAULT_RESTART_POLICY = RestartPolicy()
# A task's CPU is a demand sample only once it ran this long (before its first sample it reads 0).
FIRST_SAMPLE_MS = 2_000
# Exit reasons a Borglet reports for a task its master still wants running there.
EXIT_TRANSITIONS: dict[TaskEvent, tuple[TaskState, TaskEvent]] = {
    TaskEvent.FINISHED: (TaskState.DEAD, TaskEvent.FINISHED),
    TaskEvent.OOM: (TaskState.PENDING, TaskEvent.OOM),
    TaskEvent.FAILED: (TaskState.PENDING, TaskEvent.FAILED),
    TaskEvent.KILLED: (TaskState.PENDING, TaskEvent.EVICTED),
    TaskEvent.PREEMPTED: (TaskState.PENDING, TaskEvent.EVICTED),
    TaskEvent.EVICTED: (TaskState.PENDING, TaskEvent.EVICTED),
}


@dataclass(frozen=True)
class ReportedTask(TaskIncarnation):
    state: TaskState  # RUNNING, or DEAD once exited
    exit_reason: TaskEvent | None = None
    exit_code: int = 0
    usage: Resources | None = None
    ready: bool = False
    started_ms: int = 0  # event time the incarnation started on the Borglet (0: unknown)
    cpu_unmet_millicores: float = 0.0  # demand not served at the latest sample (machine full)


@dataclass(frozen=True)
class ReportedEvent:
    """A task event the Borglet witnessed (kept until the master acknowledges its sequence)."""

    sequence: int
    job_id: str
    task_index: int
    incarnation: int
    kind: TaskEvent
    detail: str = ""
    usage: Resources | None = None
    event_time_ms: int = 0  # when the Borglet saw it (0: unknown)


@dataclass(frozen=True)
class MachineReport:
    machine_id: str
    event_time_ms: int
    desired_version: int  # the DesiredTasks version the Borglet has applied
    tasks: tuple[ReportedTask, ...] = ()
    events: tuple[ReportedEvent, ...] = ()
    usage: Resources | None = None  # the machine's own usage (soft state)
    cached_packages: tuple[str, ...] = ()  # packages the machine holds (Borg §3.2 locality)


@dataclass(frozen=True)
class PollDiff:
    mutations: tuple[Mutation, ...]
    duplicates: tuple[TaskIncarnation, ...]  # running there, but not the master's current incarnation
    usage: Mapping[tuple[str, int], Resources]  # soft state: latest usage of its current tasks
    ready: Mapping[tuple[str, int], bool]
    # The latest CPU demand sample of its current tasks: usage served + unmet (GPA §4).
    cpu_demand: Mapping[tuple[str, int], float] = field(default_factory=dict)


def desired_tasks(state: CellState, machine_id: str) -> list[tuple[JobRecord, TaskRecord]]:
    """Tasks the master wants running on the machine (allocs are reservations, not processes)."""
    machine = state.machines[machine_id]
    if machine.state is MachineState.DOWN:
        return []
    return [(job, task) for job, task in state.tasks_on(machine_id) if not job.spec.is_alloc_set]


def _is_current(state: CellState, machine_id: str, reported: ReportedTask) -> TaskRecord | None:
    task = state.task(reported.key)
    if (
        task is None
        or task.state is not TaskState.RUNNING
        or task.machine_id != machine_id
        or task.incarnation != reported.incarnation
    ):
        return None
    return task


def diff_report(
    state: CellState,
    report: MachineReport,
    max_failures: int = DEFAULT_MAX_FAILURES,
    policy: RestartPolicy = DEFAULT_RESTART_POLICY,
) -> PollDiff:
    """The transitions a Borglet's full-state report implies, and the duplicates it runs."""
    machine = state.machines.get(report.machine_id)
    if machine is None:
        dups = tuple(r.identity for r in report.tasks if r.state is TaskState.RUNNING)
        return PollDiff((), dups, {}, {})
    mutations: list[Mutation] = []
    was_down = machine.state is MachineState.DOWN
    if was_down:
        mutations.append(
            MachineStateChanged(report.machine_id, MachineAvailability.UP, "answered a poll again")
        )
    events = {
        (e.job_id, e.task_index, e.incarnation): e for e in sorted(report.events, key=lambda e: e.sequence)
    }
    duplicates: list[TaskIncarnation] = []
    usage: dict[tuple[str, int], Resources] = {}
    ready: dict[tuple[str, int], bool] = {}
    cpu_demand: dict[tuple[str, int], float] = {}
    seen: set[tuple[str, int]] = set()
    for reported in report.tasks:
        task = None if was_down else _is_current(state, report.machine_id, reported)
        if task is None:
            if reported.state is TaskState.RUNNING:
                duplicates.append(reported.identity)
            continue
        key = task.key
        seen.add(key)
        if reported.state is TaskState.RUNNING:
            if reported.usage is not None:
                usage[key] = reported.usage
                if report.event_time_ms - reported.started_ms >= FIRST_SAMPLE_MS or not reported.started_ms:
                    cpu_demand[key] = reported.usage.cpu + reported.cpu_unmet_millicores
            ready[key] = reported.ready
            if not task.started:
                mutations.append(
                    TaskStateChanged(
                        task.job_id, task.index, task.incarnation, TaskState.RUNNING, TaskEvent.RUNNING
                    )
                )
            continue
        event = events.get((task.job_id, task.index, task.incarnation))
        exit_reason = reported.exit_reason or (event.kind if event else TaskEvent.FAILED)
        new_state, reason = EXIT_TRANSITIONS.get(exit_reason, (TaskState.PENDING, TaskEvent.FAILED))
        backoff = None
        if reason in FAILURE_EVENTS:
            failed_at = (event.event_time_ms if event is not None else 0) or report.event_time_ms
            ran = failed_at - reported.started_ms if reported.started_ms else None
            backoff = restart_backoff(policy, task, report.machine_id, failed_at, ran)
            if reason is TaskEvent.FAILED and backoff.failures > max_failures:
                new_state, reason = TaskState.DEAD, TaskEvent.FAILED_FOR_GOOD
        detail = event.detail if event is not None and event.detail else f"exit code {reported.exit_code}"
        if reason is TaskEvent.EVICTED:
            detail = f"stopped on its machine ({exit_reason.value}): {detail}"
        last_usage = event.usage if event is not None and event.usage is not None else reported.usage
        mutations.append(
            TaskStateChanged(
                task.job_id, task.index, task.incarnation, new_state, reason, detail, last_usage, backoff
            )
        )
    if not was_down and report.desired_version >= machine.desired_version:
        # The Borglet has applied our latest desired set, yet does not report these: they are gone.
        for job, task in desired_tasks(state, report.machine_id):
            if task.key not in seen:
                mutations.append(
                    TaskStateChanged(
                        job.job_id,
                        task.index,
                        task.incarnation,
                        TaskState.PENDING,
                        TaskEvent.LOST,
                        f"missing from machine {report.machine_id}'s report",
                    )
                )
    return PollDiff(tuple(mutations), tuple(duplicates), usage, ready, cpu_demand)


def machines_down(state: CellState, missed: Mapping[str, int], threshold: int) -> list[Mutation]:
    """Machines that missed ``threshold`` polls in a row are marked down (Borg §3.3)."""
    out: list[Mutation] = []
    for machine_id in sorted(missed):
        machine = state.machines.get(machine_id)
        if machine is None or machine.state is not MachineState.UP or missed[machine_id] < threshold:
            continue
        out.append(
            MachineStateChanged(machine_id, MachineAvailability.DOWN, f"missed {missed[machine_id]} polls")
        )
    return out
