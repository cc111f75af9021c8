"""Which recommender sizes a job's resource, and the user's bounds (Autopilot §3.2, §5.4).

§3.2: "The Autopilot service chooses the recommender(s) to use for a job according to
whether the resource being autoscaled is memory or CPU; how tolerant the job is to
out-of-resource events (latency tolerant or not, OOM-sensitive vs. OOM-tolerant); and
optional user inputs, which can include an explicit recommender choice, or additional
parameters ... such as upper and lower bounds on the limits."

* ``AUTO`` resolves through the §3.2.2 policy table (:func:`cellpilot.recommend.policy.statistic_for`):
  CPU batch -> S_avg, serving -> S_p95 (latency-sensitive) or S_p90; memory by OOM
  tolerance -> S_p98 / S_max / max(S_p60, 0.5 S_max), the tolerance defaulting by job size
  (§3.2.2: "low" for large jobs, "minimal" for small ones). With ``auto_ml`` (:class:`AutoMl`)
  AUTO picks the ML recommender instead; the master's default is ML for serving jobs' memory (§4.2).
* An explicit built-in choice is used as is; ``CUSTOM`` names a registered custom
  recommender (§5.4) and falls back to AUTO when that name is not registered.
* Bounds clamp the chosen value (and the largest machine caps it, so a recommendation can
  always be placed); the reason is kept for the explanation.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from cellpilot.autopilot.candidates import WINDOW_STATISTICS
from cellpilot.autopilot.vertical_targets import CLAMP_REASONS, ClampReason, bound_limits
from cellpilot.job_vocabulary import AppClass, LatencySensitivity, OomTolerance, RecommenderKind, ScalingMode
from cellpilot.recommend.policy import JobProfile, Statistic, default_oom_tolerance, statistic_for
from cellpilot.usage.buckets import Resource

# The default choice, the §3.2.2 policy table (the studies' deciders name it so).
AUTO = RecommenderKind.AUTO


@dataclass(frozen=True)
class RecommenderRef:
    """AUTO, CUSTOM with the registered recommender's name, or a built-in kind (a
    :class:`RecommenderKind` or its value)."""

    kind: RecommenderKind = RecommenderKind.AUTO
    custom_name: str = ""

    def __post_init__(self) -> None:
        try:
            kind = RecommenderKind(self.kind)
        except ValueError:
            raise ValueError(f"unknown recommender kind {self.kind!r}") from None
        if kind is RecommenderKind.UNSPECIFIED:
            raise ValueError("a recommender reference names its kind")
        object.__setattr__(self, "kind", kind)
        if (kind is RecommenderKind.CUSTOM) != bool(self.custom_name):
            raise ValueError("custom_name is required for, and only for, a custom recommender")

    @classmethod
    def builtin(cls, kind: RecommenderKind) -> RecommenderRef:
        return cls(kind)

    @classmethod
    def custom(cls, name: str) -> RecommenderRef:
        return cls(RecommenderKind.CUSTOM, name)

    @property
    def label(self) -> str:
        return f"custom:{self.custom_name}" if self.kind is RecommenderKind.CUSTOM else self.kind.value


@dataclass(frozen=True)
class VerticalConfig:
    """One resource's Autopilot settings; limits in the resource's unit (millicores, bytes)."""

    mode: ScalingMode = ScalingMode.OFF
    min_limit: float | None = None
    max_limit: float | None = None
    recommender: RecommenderRef = RecommenderRef()

    def __post_init__(self) -> None:
        if self.min_limit is not None and self.max_limit is not None and self.min_limit > self.max_limit:
            raise ValueError("min_limit exceeds max_limit")


@dataclass(frozen=True)
class JobTraits:
    """What the §3.2.2 table looks at; an UNSPECIFIED ``oom_tolerance`` is the size-based default."""

    job_class: AppClass = AppClass.LATENCY_SENSITIVE
    latency: LatencySensitivity = LatencySensitivity.HIGH
    oom_tolerance: OomTolerance = OomTolerance.UNSPECIFIED
    footprint_machines: float = 0.0  # the job's total memory limit in machines

    @property
    def effective_oom_tolerance(self) -> OomTolerance:
        """§3.2.2: the user's tolerance, else "low" for large jobs and "minimal" for small ones."""
        if self.oom_tolerance is OomTolerance.UNSPECIFIED:
            return default_oom_tolerance(self.footprint_machines)
        return self.oom_tolerance


_KIND_OF_STATISTIC: dict[Statistic, RecommenderKind] = {s: k for k, s in WINDOW_STATISTICS.items()}


class AutoMl(StrEnum):
    """When AUTO picks the ML recommender instead of the §3.2.2 moving-window table.

    §4.2: the jobs migrated to Autopilot "almost all" use the ML recommender for their
    memory limits, so the master's default is ML for the memory of serving jobs (the
    population and resource §4 measures, where the replay shows ML's reliability: see
    ``docs/results/autopilot-eval.md``), and the table for batch jobs and for CPU.
    """

    NEVER = "never"  # the §3.2.2 table for every job
    SERVING_MEMORY = "serving_memory"  # ML for serving jobs' memory (§4.2), else the table
    ALWAYS = "always"


def _uses_ml(resource: Resource, traits: JobTraits, auto_ml: AutoMl | bool) -> bool:
    if isinstance(auto_ml, bool):
        return auto_ml
    serving_memory = resource is Resource.MEMORY and traits.job_class is AppClass.LATENCY_SENSITIVE
    return auto_ml is AutoMl.ALWAYS or (auto_ml is AutoMl.SERVING_MEMORY and serving_memory)


def auto_kind(
    resource: Resource, traits: JobTraits, auto_ml: AutoMl | bool = AutoMl.NEVER
) -> RecommenderKind:
    """The §3.2.2 policy table, or the ML recommender where ``auto_ml`` says so."""
    if _uses_ml(resource, traits, auto_ml):
        return RecommenderKind.ML
    tolerance = traits.effective_oom_tolerance
    profile = JobProfile(resource, traits.job_class, traits.latency, tolerance)
    return _KIND_OF_STATISTIC[statistic_for(profile)]


@dataclass(frozen=True)
class Selection:
    ref: RecommenderRef  # concrete: a built-in kind or a registered custom recommender
    note: str  # why, for the explanation


def select_recommender(
    resource: Resource,
    config: VerticalConfig,
    traits: JobTraits,
    registered_custom: Collection[str] = (),
    auto_ml: AutoMl | bool = AutoMl.NEVER,
) -> Selection:
    choice = config.recommender
    if choice.kind is RecommenderKind.CUSTOM:
        if choice.custom_name in registered_custom:
            return Selection(choice, f"custom recommender {choice.custom_name!r} chosen by the user")
        kind = auto_kind(resource, traits, auto_ml)
        return Selection(
            RecommenderRef.builtin(kind),
            f"custom recommender {choice.custom_name!r} is not registered; fell back to {kind.value}",
        )
    if choice.kind is not RecommenderKind.AUTO:
        return Selection(choice, "chosen by the user")
    kind = auto_kind(resource, traits, auto_ml)
    tolerance = traits.effective_oom_tolerance
    job_class = "batch" if traits.job_class is AppClass.BATCH else "serving"
    if kind is RecommenderKind.ML:
        why = f"{job_class} job -> ML (§4.2: migrated jobs almost all use ML; auto_ml {auto_ml})"
    elif resource is Resource.CPU:
        why = f"{job_class} job, latency sensitivity {traits.latency.value}"
    else:
        why = f"OOM tolerance {tolerance.value}"
    return Selection(RecommenderRef.builtin(kind), f"auto: {why}")


def apply_bounds(
    value: float, config: VerticalConfig, machine_capacity: float | None = None
) -> tuple[float, ClampReason]:
    """One value through :func:`~cellpilot.autopilot.vertical_targets.bound_limits`: (value, why)."""
    if math.isnan(value):
        raise ValueError("cannot bound a missing recommendation")
    bounded, reason = bound_limits(
        [value],
        np.nan if config.min_limit is None else config.min_limit,
        np.nan if config.max_limit is None else config.max_limit,
        machine_capacity,
    )
    return float(bounded[0]), CLAMP_REASONS[int(reason[0])]
