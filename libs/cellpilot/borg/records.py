"""The records :class:`cellpilot.borg.cell_state.CellState` keeps per job, task and machine.

Plain data: every change to them goes through ``CellState.apply`` so that the state stays a
pure function of the checkpoint log (Borg §3.1).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cellpilot.borg.lifecycle import JobState, MachineState, TaskEvent, TaskState
from cellpilot.borg.model import JobSpec, MachineAvailability, MachineSpec
from cellpilot.schedule import Resources

TaskKey = tuple[str, int]  # (job id, task index)
UNLIMITED = Resources(1e18, 1e18, 1e18, 1e18)


class InvariantError(Exception):
    """A record that cannot apply to this state: the log and the code disagree."""


@dataclass(frozen=True)
class TaskIncarnation:
    """One incarnation of a task: the identity that every task mutation, task event and Borglet
    report carries (an incarnation grows by one each time the task is scheduled, Borg §3.1)."""

    job_id: str
    task_index: int
    incarnation: int

    @property
    def key(self) -> TaskKey:
        return (self.job_id, self.task_index)

    @property
    def identity(self) -> TaskIncarnation:
        """Just the incarnation, without the fields a subclass adds."""
        return TaskIncarnation(self.job_id, self.task_index, self.incarnation)


@dataclass
class TaskRecord:
    job_id: str
    index: int
    limits: Resources
    spec_version: int
    incarnation: int = 0  # grows by one each time the task is scheduled
    state: TaskState = TaskState.PENDING
    reason: TaskEvent = TaskEvent.SUBMITTED  # the event that brought it to its state (RUNNING: started)
    reason_detail: str = ""
    machine_id: str = ""
    ports: tuple[int, ...] = ()
    restarts: int = 0
    state_since_ms: int = 0
    # Restart backoff (cellpilot.borg.restart_backoff, Borg §4), set from the log's records.
    failures: int = 0  # failures in a row (OOM, error exit, failure to start)
    not_before_ms: int = 0  # not rescheduled before this event time
    last_failure: str = ""
    last_failure_ms: int = 0
    recent_failures: tuple[tuple[str, int], ...] = ()  # (machine, event time), the last few
    avoid: dict[str, int] = field(default_factory=dict)  # machine -> avoided until (event time)

    @property
    def key(self) -> TaskKey:
        return (self.job_id, self.index)

    @property
    def started(self) -> bool:
        """Its Borglet reported this incarnation running."""
        return self.state is TaskState.RUNNING and self.reason is TaskEvent.RUNNING


@dataclass
class JobRecord:
    spec: JobSpec
    spec_version: int
    state: JobState
    submitted_ms: int
    state_since_ms: int
    fencing_token: int = 0
    max_disruptions: int = 0
    tasks: dict[int, TaskRecord] = field(default_factory=dict)
    counts: dict[TaskState, int] = field(default_factory=lambda: dict.fromkeys(TaskState, 0))

    @property
    def job_id(self) -> str:
        return self.spec.job_id

    @property
    def live(self) -> bool:
        return self.state is not JobState.DEAD

    def visible_tasks(self) -> list[TaskRecord]:
        """Tasks 0 .. task_count-1 (dead tasks of a scale-down stay to keep their incarnations)."""
        return [self.tasks[i] for i in range(self.spec.task_count) if i in self.tasks]

    def task_counts(self) -> dict[TaskState, int]:
        counts = dict.fromkeys(TaskState, 0)
        for task in self.visible_tasks():
            counts[task.state] += 1
        return counts


@dataclass
class MachineRecord:
    spec: MachineSpec
    state: MachineState = MachineState.UP
    draining: bool = False
    state_since_ms: int = 0
    # Log position of the last change to the tasks wanted on it: the DesiredTasks version.
    desired_version: int = 0
    tasks: set[TaskKey] = field(default_factory=set)

    @property
    def machine_id(self) -> str:
        return self.spec.machine_id

    @property
    def availability(self) -> MachineAvailability:
        if self.state is MachineState.DOWN:
            return MachineAvailability.DOWN
        return MachineAvailability.DRAINING if self.draining else MachineAvailability.UP

    @property
    def schedulable(self) -> bool:
        return self.state is MachineState.UP and not self.draining


@dataclass(frozen=True)
class AppliedRequest:
    """A client request already applied: a retry with its id gets the same answer (Borg §4).

    ``method`` (the RPC, e.g. ``SubmitJob``) and ``digest`` (of the request's payload) tell a
    retry from another request reusing the id; both are empty for requests logged before
    they were recorded.
    """

    request_id: str
    sequence: int
    job_id: str = ""
    method: str = ""
    digest: str = ""


@dataclass(frozen=True)
class Leader:
    """The elected master replica (Borg §3.1); its epoch fences the log's writers."""

    replica_id: str
    address: str
    epoch: int
