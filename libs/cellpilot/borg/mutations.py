"""The Borgmaster's state mutations: one frozen dataclass per checkpoint-log record kind.

Borg §3.1 keeps the Borgmaster's state as a checkpoint: a periodic snapshot plus a change
log. Each class here mirrors one case of the ``CheckpointRecord.mutation`` oneof of
``checkpoint.proto``; :func:`kind_of` gives the case name (also the ``checkpoint_log.kind``
column). A :class:`LogRecord` is one log entry; applying the records in order to an empty
:class:`cellpilot.borg.cell_state.CellState` rebuilds the state at any position.
"""

from __future__ import annotations

from dataclasses import dataclass

from cellpilot.borg.lifecycle import JobState, TaskEvent, TaskState
from cellpilot.borg.model import JobSpec, MachineAvailability, MachineSpec
from cellpilot.borg.records import Leader, TaskIncarnation
from cellpilot.job_vocabulary import PriorityBand
from cellpilot.schedule import Resources


@dataclass(frozen=True)
class JobSubmitted:
    job_id: str
    spec: JobSpec
    state: JobState  # PENDING, or HELD_FOR_AUTOPILOT (Autopilot §3.1)


@dataclass(frozen=True)
class JobUpdated:
    job_id: str
    spec: JobSpec  # the complete new spec
    spec_version: int
    fencing_token: int = 0
    max_disruptions: int = 0
    hold_released: bool = False


@dataclass(frozen=True)
class JobKilled:
    job_id: str


@dataclass(frozen=True)
class JobStateChanged:
    job_id: str
    state: JobState


@dataclass(frozen=True)
class TaskScheduled(TaskIncarnation):
    machine_id: str
    ports: tuple[int, ...]
    limits: Resources


@dataclass(frozen=True)
class RestartBackoff:
    """The restart decision for a failed task (:mod:`cellpilot.borg.restart_backoff`), logged
    with the failure so that replaying the log gives the same backoff (Borg §4)."""

    failures: int  # failures in a row, this one included
    not_before_ms: int  # event time before which the task is not rescheduled
    failed_at_ms: int
    machine_id: str  # where it failed
    avoid_until_ms: int = 0  # kept off machine_id until then; 0 = not avoided


@dataclass(frozen=True)
class TaskStateChanged(TaskIncarnation):
    """A task transition of Borg Figure 2. ``reason`` FAILED_FOR_GOOD is FAILED -> DEAD on the wire."""

    state: TaskState
    reason: TaskEvent
    detail: str = ""
    usage: Resources | None = None
    backoff: RestartBackoff | None = None  # set for the task's own failures (OOM, FAILED)


@dataclass(frozen=True)
class MachineRegistered:
    spec: MachineSpec


@dataclass(frozen=True)
class MachineStateChanged:
    machine_id: str
    state: MachineAvailability
    detail: str = ""


@dataclass(frozen=True)
class QuotaSet:
    user: str
    band: PriorityBand
    limit: Resources


@dataclass(frozen=True)
class LeaderElected(Leader):
    """A replica became the master: the log's writer from this record on."""


@dataclass(frozen=True)
class LavaHost:
    """LAVA's state of one machine (§4.3), as the log records it (see
    :mod:`cellpilot.schedule.lifetime_aware.lava` for the state machine)."""

    machine_id: str
    state: int  # lava.EMPTY, OPEN or RECYCLING
    lifetime_class: int  # 0..3 = LC1..LC4; -1: none (empty)
    deadline_ms: int = 0  # event time; 0 = none
    residual: tuple[tuple[str, int], ...] = ()  # (job_id, task_index), sorted


@dataclass(frozen=True)
class LavaHostsChanged:
    """The LAVA host states the master changed; a host recorded empty leaves the state."""

    hosts: tuple[LavaHost, ...]


@dataclass(frozen=True)
class LifetimeModelTrained:
    """The cell's lifetime model (LAVA §3): ``model_json`` is :meth:`LifetimeModel.to_json`."""

    model_json: str
    runs: int
    trained_at_ms: int


Mutation = (
    JobSubmitted
    | JobUpdated
    | JobKilled
    | JobStateChanged
    | TaskScheduled
    | TaskStateChanged
    | MachineRegistered
    | MachineStateChanged
    | QuotaSet
    | LeaderElected
    | LavaHostsChanged
    | LifetimeModelTrained
)

KINDS: dict[type, str] = {
    JobSubmitted: "job_submitted",
    JobUpdated: "job_updated",
    JobKilled: "job_killed",
    JobStateChanged: "job_state_changed",
    TaskScheduled: "task_scheduled",
    TaskStateChanged: "task_state_changed",
    MachineRegistered: "machine_registered",
    MachineStateChanged: "machine_state_changed",
    QuotaSet: "quota_set",
    LeaderElected: "leader_elected",
    LavaHostsChanged: "lava_hosts_changed",
    LifetimeModelTrained: "lifetime_model_trained",
}


def kind_of(mutation: Mutation) -> str:
    """The ``CheckpointRecord.mutation`` oneof case this mutation is recorded as."""
    return KINDS[type(mutation)]


@dataclass(frozen=True)
class LogRecord:
    """One checkpoint-log entry: a mutation at a dense sequence, appended by a master's epoch."""

    sequence: int
    epoch: int
    event_time_ms: int
    mutation: Mutation
    request_id: str = ""
    cause_id: str = ""
    request_method: str = ""  # with request_id: the RPC it was used for
    request_digest: str = ""  # with request_id: a digest of that request's payload


def to_records(
    first_sequence: int,
    epoch: int,
    event_time_ms: int,
    mutations: tuple[Mutation, ...] | list[Mutation],
    request_id: str = "",
    cause_id: str = "",
    *,
    request_method: str = "",
    request_digest: str = "",
) -> list[LogRecord]:
    """Log records for one decision: dense sequences; the request (its id, method and payload
    digest) goes on the first record only."""
    return [
        LogRecord(
            first_sequence, epoch, event_time_ms, m, request_id, cause_id, request_method, request_digest
        )
        if i == 0
        else LogRecord(first_sequence + i, epoch, event_time_ms, m, "", cause_id)
        for i, m in enumerate(mutations)
    ]
