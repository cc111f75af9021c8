"""Transition tables: for each state, the events allowed and the state they lead to.

Borg Figure 2 names three task states — pending, running, dead — and the transitions
submit, schedule, evict, fail, finish, kill, lost and update; users trigger submit, kill
and update. Borg §2.3 adds that an update may leave a task in place or stop and
reschedule it. Autopilot §3.1 adds the hold: an Autopiloted job waits until its first
recommendation. A failed or OOM-killed task of a long-running job is rescheduled
(back to pending); the Borgmaster decides when a job has failed for good.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Generic, TypeVar


class TaskState(enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    DEAD = "dead"


class TaskEvent(enum.Enum):
    SUBMITTED = "submitted"  # the task exists (job submitted, scaled up, or resubmitted)
    SCHEDULED = "scheduled"  # assigned to a machine
    RUNNING = "running"  # its Borglet reports it started (stays RUNNING)
    OOM = "oom"  # killed for exceeding memory; rescheduled
    EVICTED = "evicted"  # removed by the system (update no longer fits, maintenance)
    PREEMPTED = "preempted"  # killed to make room for higher priority work
    FINISHED = "finished"  # exited successfully
    FAILED = "failed"  # exited with an error; rescheduled
    FAILED_FOR_GOOD = "failed-for-good"  # gave up restarting it
    LOST = "lost"  # its machine went down
    KILLED = "killed"  # by the user, or by scaling down
    UPDATED = "updated"  # limits or spec changed in place


class JobState(enum.Enum):
    HELD_FOR_AUTOPILOT = "held-for-autopilot"
    PENDING = "pending"  # admitted, no task running
    RUNNING = "running"  # at least one task running
    DEAD = "dead"


class JobEvent(enum.Enum):
    SUBMITTED = "submitted"
    RELEASED = "released"  # Autopilot's first recommendation arrived
    UPDATED = "updated"
    TASK_STARTED = "task-started"  # the first task runs
    ALL_TASKS_STOPPED = "all-tasks-stopped"  # no task runs any more, some are pending
    ALL_TASKS_DEAD = "all-tasks-dead"
    KILLED = "killed"


class MachineState(enum.Enum):
    UP = "up"
    DOWN = "down"  # missed several polls; its tasks are rescheduled (Borg §3.3)
    REMOVED = "removed"


class MachineEvent(enum.Enum):
    REGISTERED = "registered"
    POLL_ANSWERED = "poll-answered"
    POLLS_MISSED = "polls-missed"
    REMOVED = "removed"


TASK_TRANSITIONS: dict[TaskState, dict[TaskEvent, TaskState]] = {
    TaskState.PENDING: {
        TaskEvent.SCHEDULED: TaskState.RUNNING,
        TaskEvent.UPDATED: TaskState.PENDING,
        TaskEvent.KILLED: TaskState.DEAD,
        TaskEvent.FAILED_FOR_GOOD: TaskState.DEAD,
    },
    TaskState.RUNNING: {
        TaskEvent.RUNNING: TaskState.RUNNING,
        TaskEvent.UPDATED: TaskState.RUNNING,
        TaskEvent.OOM: TaskState.PENDING,
        TaskEvent.EVICTED: TaskState.PENDING,
        TaskEvent.PREEMPTED: TaskState.PENDING,
        TaskEvent.FAILED: TaskState.PENDING,
        TaskEvent.LOST: TaskState.PENDING,
        TaskEvent.FINISHED: TaskState.DEAD,
        TaskEvent.KILLED: TaskState.DEAD,
        TaskEvent.FAILED_FOR_GOOD: TaskState.DEAD,
    },
    TaskState.DEAD: {
        TaskEvent.SUBMITTED: TaskState.PENDING,
    },
}

JOB_TRANSITIONS: dict[JobState, dict[JobEvent, JobState]] = {
    JobState.HELD_FOR_AUTOPILOT: {
        JobEvent.RELEASED: JobState.PENDING,
        JobEvent.UPDATED: JobState.HELD_FOR_AUTOPILOT,
        JobEvent.KILLED: JobState.DEAD,
    },
    JobState.PENDING: {
        JobEvent.TASK_STARTED: JobState.RUNNING,
        JobEvent.UPDATED: JobState.PENDING,
        JobEvent.ALL_TASKS_DEAD: JobState.DEAD,
        JobEvent.KILLED: JobState.DEAD,
    },
    JobState.RUNNING: {
        JobEvent.UPDATED: JobState.RUNNING,
        JobEvent.ALL_TASKS_STOPPED: JobState.PENDING,
        JobEvent.ALL_TASKS_DEAD: JobState.DEAD,
        JobEvent.KILLED: JobState.DEAD,
    },
    JobState.DEAD: {},
}

MACHINE_TRANSITIONS: dict[MachineState, dict[MachineEvent, MachineState]] = {
    MachineState.UP: {
        MachineEvent.REGISTERED: MachineState.UP,
        MachineEvent.POLL_ANSWERED: MachineState.UP,
        MachineEvent.POLLS_MISSED: MachineState.DOWN,
        MachineEvent.REMOVED: MachineState.REMOVED,
    },
    MachineState.DOWN: {
        MachineEvent.REGISTERED: MachineState.UP,
        MachineEvent.POLL_ANSWERED: MachineState.UP,
        MachineEvent.REMOVED: MachineState.REMOVED,
    },
    MachineState.REMOVED: {MachineEvent.REGISTERED: MachineState.UP},
}

S = TypeVar("S", bound=enum.Enum)
E = TypeVar("E", bound=enum.Enum)


@dataclass(frozen=True)
class Transition(Generic[S]):
    """The outcome of applying an event: the next state, or why the event is not allowed."""

    allowed: bool
    state: S
    reason: str = ""


def transition(table: dict[S, dict[E, S]], state: S, event: E) -> Transition[S]:
    """Look the event up in the table; an illegal event is a result, not an exception."""
    next_state = table[state].get(event)
    if next_state is None:
        allowed = ", ".join(e.value for e in table[state]) or "none"
        return Transition(
            False, state, f"{event.value} is not allowed in state {state.value} (allowed: {allowed})"
        )
    return Transition(True, next_state)
