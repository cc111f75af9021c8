"""What applying a log record changed: job, task and machine events, in log order.

:meth:`cellpilot.borg.cell_state.CellState.apply` returns these for every record, including
the consequences it derives (a killed job's tasks, a lost machine's tasks, a job whose
first task starts). The Borgmaster publishes them on Kafka ``borg.events`` after the record
is appended, so their order is the log's order; the scheduling view
follows them to keep its cell in step.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from cellpilot.borg.lifecycle import JobState, TaskEvent, TaskState
from cellpilot.borg.model import JobSpec, MachineAvailability
from cellpilot.borg.records import TaskIncarnation
from cellpilot.schedule import Resources


class JobEventKind(enum.Enum):
    SUBMITTED = "submitted"
    RELEASED = "released"  # Autopilot hold lifted (Autopilot §3.1)
    UPDATED = "updated"
    STATE_CHANGED = "state-changed"
    KILLED = "killed"


class MachineEventKind(enum.Enum):
    REGISTERED = "registered"
    STATE_CHANGED = "state-changed"


@dataclass(frozen=True)
class JobChange:
    job_id: str
    kind: JobEventKind
    state: JobState
    spec: JobSpec | None
    spec_version: int
    event_time_ms: int
    log_sequence: int
    cause_id: str = ""


@dataclass(frozen=True)
class TaskChange(TaskIncarnation):
    kind: TaskEvent
    state: TaskState  # after the event
    machine_id: str  # where it happened; empty for SUBMITTED
    event_time_ms: int
    log_sequence: int
    cause_id: str = ""
    detail: str = ""
    limits: Resources | None = None
    usage: Resources | None = None


@dataclass(frozen=True)
class MachineChange:
    machine_id: str
    kind: MachineEventKind
    state: MachineAvailability
    detail: str
    event_time_ms: int
    log_sequence: int
    cause_id: str = ""


Change = JobChange | TaskChange | MachineChange


def change_key(change: Change) -> str:
    """Kafka key: the job id, or the machine id for machine events (topics.py)."""
    return change.machine_id if isinstance(change, MachineChange) else change.job_id
