"""The words a job is described in, once for the whole core.

A job's spec (Borg §2.3), its scheduling (Borg §2.5, §6.2) and its Autopilot settings
(Autopilot §3.2, §3.3, §5) share one set of enumerations: the Borgmaster's model
(:mod:`cellpilot.borg.model`), the scheduler (:mod:`cellpilot.schedule`), the §3.2.2 policy
table (:mod:`cellpilot.recommend.policy`), the Autopilot master (:mod:`cellpilot.autopilot`)
and the studies (:mod:`cellpilot.evaluate`) all use these members.

Each member is named like the API's value without its prefix (``SCALING_MODE_DRY_RUN`` is
:attr:`ScalingMode.DRY_RUN`), so a service's ``convert`` module maps an enum to and from the
wire by name, with one table per enum. ``UNSPECIFIED`` is kept so that validation can name
the field a client left unset; what an unset value means (OFF, AUTO, the size-based OOM
tolerance ...) is decided where the value is read. String values are the lower-case names.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum, auto


class PriorityBand(IntEnum):
    """Borg §2.5's non-overlapping priority bands, lowest first (the levels of each band are in
    :mod:`cellpilot.schedule.priority`); the value orders the bands."""

    UNSPECIFIED = -1
    BEST_EFFORT = 0
    BATCH = 1
    PRODUCTION = 2
    MONITORING = 3


class AppClass(StrEnum):
    """Borg §6.2's application classes. Autopilot §3.2.2 calls latency-sensitive jobs
    *serving* jobs: :attr:`SERVING` is the same member."""

    UNSPECIFIED = auto()
    LATENCY_SENSITIVE = auto()
    BATCH = auto()
    SERVING = LATENCY_SENSITIVE


class LatencySensitivity(StrEnum):
    """How a serving job's CPU is sized (Autopilot §3.2.2): HIGH -> S_p95, MODERATE -> S_p90."""

    UNSPECIFIED = auto()
    HIGH = auto()
    MODERATE = auto()


class OomTolerance(StrEnum):
    """How a job's memory is sized (Autopilot §3.2.2): LOW -> S_p98, INTERMEDIATE ->
    max(S_p60, 0.5 S_max), MINIMAL (the most stringent) -> S_max."""

    UNSPECIFIED = auto()
    LOW = auto()
    INTERMEDIATE = auto()
    MINIMAL = auto()


class MemoryLimitKind(StrEnum):
    """Hard limit: the task is killed at it; soft: only under machine memory pressure (Autopilot §4.1)."""

    UNSPECIFIED = auto()
    HARD = auto()
    SOFT = auto()


class JobKind(StrEnum):
    """A job, or an alloc set whose tasks are allocs (Borg §2.4)."""

    UNSPECIFIED = auto()
    JOB = auto()
    ALLOC_SET = auto()


class ConstraintKind(StrEnum):
    """Hard constraints filter machines, soft ones score them (Borg §2.3)."""

    UNSPECIFIED = auto()
    HARD = auto()
    SOFT = auto()


class ConstraintOperator(StrEnum):
    """How a constraint compares a machine attribute; LESS/GREATER compare as numbers."""

    UNSPECIFIED = auto()
    EQUAL = auto()
    NOT_EQUAL = auto()
    LESS_THAN = auto()
    GREATER_THAN = auto()
    EXISTS = auto()
    NOT_EXISTS = auto()


class ScalingMode(StrEnum):
    """OFF, DRY_RUN (recommendations visible, never actuated: Autopilot §5.1, §5.2) or ON."""

    UNSPECIFIED = auto()
    OFF = auto()
    DRY_RUN = auto()
    ON = auto()


class RecommenderKind(StrEnum):
    """Which recommender sizes a resource (Autopilot §3.2): AUTO (the §3.2.2 policy table), a
    built-in one (registered with its estimator in
    :data:`cellpilot.autopilot.recommender_registry.BUILTIN_REGISTRY`, which orders their
    output columns) or a registered custom one (§5.4)."""

    UNSPECIFIED = auto()
    AUTO = auto()
    MOVING_WINDOW_MAX = auto()
    MOVING_WINDOW_AVG = auto()
    MOVING_WINDOW_P90 = auto()
    MOVING_WINDOW_P95 = auto()
    MOVING_WINDOW_P98 = auto()
    MOVING_WINDOW_P60_HALF_MAX = auto()
    ML = auto()
    CUSTOM = auto()


class HorizontalSource(StrEnum):
    """Where horizontal scaling's n_r comes from (Autopilot §3.3)."""

    UNSPECIFIED = auto()
    CPU_UTILIZATION = auto()
    TARGET_SIZE = auto()


class HorizontalStatistic(StrEnum):
    """r_S over the horizon (Autopilot §3.3): the max or the 95th percentile."""

    UNSPECIFIED = auto()
    MAX = auto()
    P95 = auto()
