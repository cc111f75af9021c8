"""What the Borglet knows about a task it hosts: the plan the master sent, and the live record.

Plain dataclasses; ``convert`` turns protobuf messages into these and back. Task events use
the Borg Figure 2 vocabulary of :mod:`cellpilot.borg.lifecycle`; a hosted task's phases on its
machine are :mod:`cellpilot.borglet.task_lifecycle`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cellpilot.borg.health_checks import HealthState, ResolvedCheck
from cellpilot.borg.lifecycle import TASK_TRANSITIONS, TaskEvent, TaskState, transition
from cellpilot.borg.records import TaskIncarnation
from cellpilot.borg.records import TaskKey as TaskKey  # re-exported: the Borglet keys its tasks the same way
from cellpilot.borglet.task_lifecycle import (
    NO_PROCESS_TASK_PHASES,
    PROCESS_TASK_PHASES,
    Phase,
    PhaseChange,
    PhaseEventKind,
)
from cellpilot.world.job_demand import JobDemand


@dataclass(frozen=True)
class Limits:
    cpu_millicores: int = 0  # 0 = no limit
    memory_bytes: int = 0  # 0 = no limit
    disk_bytes: int = 0
    ports: int = 0


@dataclass(frozen=True)
class ProcessPlan:
    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    health_check: ResolvedCheck | None = None  # Borg §2.6; None: ready once running


@dataclass(frozen=True)
class SimulatedPlan:
    usage_model: str
    params: tuple[tuple[str, float], ...]  # resolved (defaults filled), sorted by name
    seed: int = 0
    duration_seconds: int = 0  # 0 = runs until killed
    startup_seconds: int = 0
    demand: JobDemand | None = None  # the job's demand, shared among its ready tasks

    @property
    def params_map(self) -> Mapping[str, float]:
        return dict(self.params)


@dataclass(frozen=True)
class UnrunnablePlan:
    """A task this Borglet cannot run: a field of its plan it cannot read, or a runtime it does not
    offer. It is recorded and reported FAILED with ``reason``, never started; the rest of the
    desired set runs (a bad task fails alone, never the machine's poll)."""

    reason: str


@dataclass(frozen=True)
class TaskPlan(TaskIncarnation):
    """A task the master wants on a machine (``TaskAssignment``)."""

    priority: int
    band: int  # PriorityBand wire value, echoed only
    limits: Limits
    hard_memory_limit: bool
    runtime: ProcessPlan | SimulatedPlan | UnrunnablePlan
    package_ids: tuple[str, ...] = ()
    ports: tuple[int, ...] = ()
    spec_version: int = 0
    latency_sensitive: bool = True  # Borg §6.2 appclass: served first under CPU contention

    @property
    def name(self) -> str:
        return f"{self.job_id}/{self.task_index}#{self.incarnation}"


@dataclass(eq=False)
class HostedTask:
    """One task on one machine as its Borglet keeps it, from its start to the master forgetting
    it: plan, phase, why it is stopping, how it ended, its latest usage. (The Borgmaster's record
    of a task is :class:`cellpilot.borg.records.TaskRecord`.) Its phase changes only through
    :meth:`cellpilot.borglet.machine_agent.MachineAgent.advance`."""

    machine_id: str
    plan: TaskPlan
    phase: Phase
    started_ms: int
    exit_kind: TaskEvent | None = None  # FINISHED, FAILED, OOM, KILLED, PREEMPTED, EVICTED
    exit_code: int = 0
    exit_detail: str = ""
    exit_ms: int = 0
    exit_sequence: int = 0  # sequence of the exit event, for forgetting the task once acked
    # Why it is being stopped (set by the first stop, or by a kill of the Borglet's own), so the
    # process's exit is reported with this kind, detail, cause and time.
    stop_kind: TaskEvent | None = None
    stop_detail: str = ""
    stop_cause: str = ""
    stop_ms: int | None = None
    cpu_millicores: float = 0.0  # latest usage sample
    memory_bytes: int = 0
    cpu_throttled: bool = False
    cpu_unmet_millicores: float = 0.0  # demand not served at the latest sample
    health: HealthState = field(default_factory=HealthState)  # its health checks so far (process)
    restarts: int = 0
    process: Any = None  # the process runtime's handle
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def alive(self) -> bool:
        return self.phase is not Phase.DEAD

    @property
    def simulated(self) -> bool:
        return isinstance(self.plan.runtime, SimulatedPlan)

    @property
    def phases(self) -> dict[Phase, dict[PhaseEventKind, PhaseChange]]:
        """Its lifecycle's table: a process's, or that of a task without one."""
        return PROCESS_TASK_PHASES if isinstance(self.plan.runtime, ProcessPlan) else NO_PROCESS_TASK_PHASES


@dataclass(frozen=True)
class BorgletEvent:
    """A task event this Borglet witnessed, kept until the master acknowledges its sequence."""

    sequence: int
    machine_id: str
    job_id: str
    task_index: int
    incarnation: int
    kind: TaskEvent
    state: TaskState  # the task's state after the event (Borg Figure 2, as the master sees it)
    event_time_ms: int
    cause_id: str
    detail: str
    limits: Limits
    cpu_millicores: float
    memory_bytes: int


def state_after(kind: TaskEvent) -> TaskState:
    """The master-side task state after an event witnessed on a running task (Figure 2)."""
    result = transition(TASK_TRANSITIONS, TaskState.RUNNING, kind)
    if not result.allowed:
        raise ValueError(result.reason)
    return result.state
