"""What the Borgmaster holds, as plain frozen data: job specs, machine specs and their enums.

These mirror the v1 API messages (``job.proto``, ``machine.proto``) field for field so the
service's ``convert`` module can translate losslessly, but the core never sees a protobuf
type (docs/architecture.md rule 2). Resource vectors are :class:`cellpilot.schedule.Resources`
(CPU milli-cores, RAM bytes, disk bytes, ports: Borg §2.3 specifies every dimension
independently). The job's enumerations are :mod:`cellpilot.job_vocabulary`'s.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from cellpilot.job_vocabulary import (
    AppClass,
    ConstraintKind,
    ConstraintOperator,
    HorizontalSource,
    HorizontalStatistic,
    JobKind,
    LatencySensitivity,
    MemoryLimitKind,
    OomTolerance,
    PriorityBand,
    RecommenderKind,
    ScalingMode,
)
from cellpilot.schedule import Resources, band_of


class MachineAvailability(enum.Enum):
    """A machine as the API shows it: UP, DOWN (missed polls, Borg §3.3) or DRAINING."""

    UNSPECIFIED = "unspecified"
    UP = "up"
    DOWN = "down"
    DRAINING = "draining"


@dataclass(frozen=True)
class Constraint:
    """A condition on a machine attribute (Borg §2.3); LESS/GREATER compare as numbers."""

    attribute: str
    operator: ConstraintOperator
    value: str = ""
    kind: ConstraintKind = ConstraintKind.HARD


@dataclass(frozen=True)
class HealthCheck:
    """A process task's health check (Borg §2.6); see :mod:`cellpilot.borg.health_checks`.
    Zero times and threshold mean the defaults."""

    http_url: str = ""
    command: tuple[str, ...] = ()
    interval_ms: int = 0
    timeout_ms: int = 0
    failure_threshold: int = 0
    initial_delay_ms: int = 0


@dataclass(frozen=True)
class ProcessRuntime:
    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    health_check: HealthCheck | None = None


@dataclass(frozen=True)
class SharedDemand:
    """A job's demand shared among its ready tasks (:mod:`cellpilot.world.job_demand`)."""

    usage_model: str = ""
    params: tuple[tuple[str, float], ...] = ()
    trace_step_seconds: int = 0  # > 0 when a trace is replayed instead of a model
    trace_cpu_millicores: tuple[float, ...] = ()
    trace_memory_bytes: tuple[int, ...] = ()
    imbalance: float = 0.0

    @property
    def has_trace(self) -> bool:
        return bool(self.trace_step_seconds or self.trace_cpu_millicores or self.trace_memory_bytes)


@dataclass(frozen=True)
class SimulatedRuntime:
    usage_model: str = ""
    params: tuple[tuple[str, float], ...] = ()
    trace_uri: str = ""
    seed: int = 0
    duration_seconds: int = 0
    startup_seconds: int = 0
    demand: SharedDemand | None = None


Runtime = ProcessRuntime | SimulatedRuntime | None


@dataclass(frozen=True)
class TaskSpec:
    """What every task of a job runs and with which limits (Borg §2.3)."""

    limits: Resources
    memory_limit_kind: MemoryLimitKind = MemoryLimitKind.UNSPECIFIED
    runtime: Runtime = None
    package_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class VerticalScaling:
    mode: ScalingMode = ScalingMode.UNSPECIFIED
    min_limit: int = 0
    max_limit: int = 0
    recommender: RecommenderKind = RecommenderKind.UNSPECIFIED
    custom_name: str = ""


@dataclass(frozen=True)
class HorizontalScaling:
    mode: ScalingMode = ScalingMode.UNSPECIFIED
    min_tasks: int = 0
    max_tasks: int = 0
    source: HorizontalSource = HorizontalSource.UNSPECIFIED
    target_utilization: float = 0.0
    statistic: HorizontalStatistic = HorizontalStatistic.UNSPECIFIED
    averaging_window_seconds: int = 0
    horizon_seconds: int = 0
    target_size_recommender: str = ""
    deferred_downscaling_seconds: int = 0
    slow_decay_half_period_seconds: int = 0
    small_change_fraction: float = 0.0
    max_initializing_fraction: float = 0.0
    reference_cpu_millicores: int = 0


ACTIVE_MODES = frozenset({ScalingMode.ON, ScalingMode.DRY_RUN})


@dataclass(frozen=True)
class AutopilotConfig:
    cpu: VerticalScaling = field(default_factory=VerticalScaling)
    memory: VerticalScaling = field(default_factory=VerticalScaling)
    horizontal: HorizontalScaling = field(default_factory=HorizontalScaling)

    @property
    def active(self) -> bool:
        """Some scaling is ON or DRY_RUN: the job waits for Autopilot's first recommendation."""
        modes = (self.cpu.mode, self.memory.mode, self.horizontal.mode)
        return any(mode in ACTIVE_MODES for mode in modes)


@dataclass(frozen=True)
class JobSpec:
    """A job as its user declares it (Borg §2.3); its id is ``<user>/<name>``."""

    name: str
    user: str
    priority: int
    task: TaskSpec
    task_count: int = 1
    band: PriorityBand = PriorityBand.UNSPECIFIED
    app_class: AppClass = AppClass.UNSPECIFIED
    latency_sensitivity: LatencySensitivity = LatencySensitivity.UNSPECIFIED
    oom_tolerance: OomTolerance = OomTolerance.UNSPECIFIED
    kind: JobKind = JobKind.UNSPECIFIED
    constraints: tuple[Constraint, ...] = ()
    autopilot: AutopilotConfig = field(default_factory=AutopilotConfig)
    alloc_set_job_id: str = ""
    labels: tuple[tuple[str, str], ...] = ()

    @property
    def job_id(self) -> str:
        return job_id_of(self.user, self.name)

    @property
    def effective_band(self) -> PriorityBand:
        return band_of(self.priority)

    @property
    def is_alloc_set(self) -> bool:
        return self.kind is JobKind.ALLOC_SET

    @property
    def effective_memory_limit_kind(self) -> MemoryLimitKind:
        """How the Borglets enforce the memory limit. A kind the user set is kept (the option to
        keep hard limits); unset, a job whose memory Autopilot manages (mode ON) runs with a soft
        limit, as Autopilot switches the jobs it manages to soft RAM limits (Autopilot §4.1), and
        every other job with a hard one."""
        if self.task.memory_limit_kind is not MemoryLimitKind.UNSPECIFIED:
            return self.task.memory_limit_kind
        if self.autopilot.memory.mode is ScalingMode.ON:
            return MemoryLimitKind.SOFT
        return MemoryLimitKind.HARD


def runs_same(old: JobSpec, new: JobSpec) -> bool:
    """Running tasks need no change between the two specs (same task spec, priority, placement)."""
    return (
        old.task == new.task
        and old.priority == new.priority
        and old.constraints == new.constraints
        and old.app_class == new.app_class
    )


def needs_restart(old: JobSpec, new: JobSpec) -> bool:
    """Borg §2.3: pushing a new binary (runtime or packages) always restarts the task."""
    return old.task.runtime != new.task.runtime or old.task.package_ids != new.task.package_ids


def job_id_of(user: str, name: str) -> str:
    return f"{user}/{name}"


@dataclass(frozen=True)
class MachineSpec:
    """A machine as its Borglet registers it: capacity, attributes and failure domains."""

    machine_id: str
    borglet_address: str
    capacity: Resources
    attributes: tuple[tuple[str, str], ...] = ()
    rack: str = ""
    power_domain: str = ""
    first_port: int = 0
