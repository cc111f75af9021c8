"""The limit setters compared in the replay: manual limits, Autopilot's two recommenders, and VPA.

Each setter sees one 5-minute window of a chunk of jobs at a time (what the monitoring
system would report: every running task's observed usage, its OOMs, its current limit)
and returns, per job, the limit it wants applied from now on (NaN: no change). The replay
(:mod:`cellpilot.evaluate.autopilot_replay`) applies it after the actuation delay and
models the consequences.

* **manual** (§4): the owner's limits from the workload; the owner reacts only to an OOM
  alert (see :class:`ManualResponse`), by raising the job's limit by hand.
* **moving window** (§3.2.2) and **ML** (§3.2.3): the library pipelines
  (:func:`cellpilot.recommend.pipeline.moving_window_recommender`, ``ml_recommender``)
  fed the job's 5-minute histogram, s[t] = sum over tasks of s_i[t] (§3.2.1): one sample
  per running task at its window peak for memory, the window's usage distribution for CPU.
  The moving window's statistic comes from the policy table per job (class, latency, OOM
  tolerance).
* **VPA**: :class:`cellpilot.evaluate.vpa.VpaRecommender` plus its updater's rule for when
  to resize.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

import numpy as np
import numpy.typing as npt

from cellpilot.evaluate.vpa import VpaConfig, VpaRecommender, updater_decision
from cellpilot.recommend.explanation import JobSettings
from cellpilot.recommend.ml_ensemble import EnsembleConfig
from cellpilot.recommend.pipeline import (
    RecommenderState,
    VerticalRecommender,
    ml_recommender,
    moving_window_recommender,
)
from cellpilot.recommend.policy import JobProfile, statistic_codes, statistic_for
from cellpilot.usage.buckets import Resource
from cellpilot.workloads.task_signals import WINDOW_MS, WINDOWS_PER_DAY, JobTraits

FloatArray = npt.NDArray[np.float64]
IntpArray = npt.NDArray[np.intp]
BoolArray = npt.NDArray[np.bool_]


class PolicyKind(StrEnum):
    MANUAL = "manual"
    MOVING_WINDOW = "moving-window"
    ML = "ml"
    VPA = "vpa"


class Enforcement(StrEnum):
    """How a RAM limit is enforced (§2.3): hard = OOM at the limit; soft = only under machine pressure."""

    HARD = "hard"
    SOFT = "soft"


# §3.2.3's five hyperparameters (d, w_o, w_u, w_dL, w_dm) as EnsembleConfig fields.
ML_HYPERPARAMETERS: tuple[str, ...] = (
    "cost_decay",
    "w_overrun",
    "w_underrun",
    "w_limit_change",
    "w_model_change",
)


@dataclass(frozen=True)
class RecommenderSpec:
    """One compared way of setting limits: ``name`` labels the results.

    ``manual_owner`` says whose manual limits the job starts from (and keeps, for the
    manual kind): the hard-limit or the soft-limit owner's. §4.2: the jobs that migrated
    to Autopilot "almost all used hard memory limits before the migration"; Autopilot
    switches all its jobs to soft limits (§4.1). VPA sets the pod's *request*, which a
    container may exceed until its node runs short of memory: the soft model.
    """

    name: str
    kind: PolicyKind
    enforcement: Enforcement
    manual_owner: Enforcement = Enforcement.HARD
    # ML kind: overrides the replay's configuration (a sweep); not hashed (numpy inside).
    ml: EnsembleConfig | None = field(default=None, compare=False)

    def describe(self) -> dict[str, object]:
        out: dict[str, object] = {
            "name": self.name,
            "kind": self.kind.value,
            "enforcement": self.enforcement.value,
            "manual_owner": self.manual_owner.value,
        }
        if self.ml is not None:
            out["ml"] = {k: getattr(self.ml, k) for k in ML_HYPERPARAMETERS}
        return out


STANDARD_RECOMMENDERS: dict[str, RecommenderSpec] = {
    "manual-hard": RecommenderSpec("manual-hard", PolicyKind.MANUAL, Enforcement.HARD, Enforcement.HARD),
    "manual-soft": RecommenderSpec("manual-soft", PolicyKind.MANUAL, Enforcement.SOFT, Enforcement.SOFT),
    "moving-window": RecommenderSpec("moving-window", PolicyKind.MOVING_WINDOW, Enforcement.SOFT),
    "ml": RecommenderSpec("ml", PolicyKind.ML, Enforcement.SOFT),
    "vpa": RecommenderSpec("vpa", PolicyKind.VPA, Enforcement.SOFT),
}


def parse_recommenders(text: str) -> tuple[RecommenderSpec, ...]:
    """``"manual-hard,ml,vpa:hard"``: standard names, optionally ``:hard`` / ``:soft`` enforcement."""
    specs: list[RecommenderSpec] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, _, enforcement = item.partition(":")
        if name not in STANDARD_RECOMMENDERS:
            raise ValueError(f"unknown recommender {name!r} (known: {', '.join(STANDARD_RECOMMENDERS)})")
        spec = STANDARD_RECOMMENDERS[name]
        if enforcement:
            spec = RecommenderSpec(item, spec.kind, Enforcement(enforcement), spec.manual_owner)
        if any(s.name == spec.name for s in specs):
            raise ValueError(f"recommender {spec.name!r} listed twice")
        specs.append(spec)
    if not specs:
        raise ValueError("no recommenders given")
    return tuple(specs)


@dataclass(frozen=True)
class ManualResponse:
    """How the owner of a manually-limited job reacts to OOMs.

    §4.4: manual limits change about 0.001 times per job-day; Figure 9b shows an on-call
    raising a leaking job's limit about two hours after it started to OOM. We model an alert
    when the job's OOMs over the trailing day reach max(``alert_ooms``, ``alert_fraction`` x
    running tasks), answered ``response_ms`` later by raising the job's limit to
    ``raise_factor`` x the larger of its current limit and its highest observed usage over
    the trailing day; the owner then waits ``cooldown_ms`` before reacting again.
    """

    alert_ooms: int = 3
    alert_fraction: float = 0.1
    response_ms: int = 2 * 3_600_000
    raise_factor: float = 1.3
    cooldown_ms: int = 6 * 3_600_000


@dataclass(frozen=True, eq=False)
class Observation:
    """One window of a chunk as a setter sees it (arrays over the chunk's N tasks / J jobs)."""

    window: int
    time_ms: int  # the window's end
    running: BoolArray  # (N,)
    observed: FloatArray  # (N,) memory: the observed window peak; CPU: unused (see points)
    oom: BoolArray  # (N,)
    task_limit: FloatArray  # (N,) limit in force during the window
    job_limit: FloatArray  # (J,) the setter's applied job limit (NaN before its first)
    points: FloatArray | None = None  # CPU: (N, P) observed usage points of the window
    fractions: FloatArray | None = None  # CPU: (N, P) share of the window's samples per point


class Setter(Protocol):
    def step(self, obs: Observation) -> FloatArray: ...


@dataclass(frozen=True, eq=False)
class ChunkLayout:
    """Which job each task column belongs to, and each job's traits."""

    job_of_task: IntpArray  # (N,)
    bounds: IntpArray  # (J + 1,)
    traits: tuple[JobTraits, ...]

    @property
    def jobs(self) -> int:
        return len(self.traits)

    def per_job_max(self, values: FloatArray) -> FloatArray:
        """Per job, the max of ``values`` over its task columns (NaN ignored; NaN if none)."""
        filled = np.where(np.isnan(values), -np.inf, values)
        out = np.maximum.reduceat(filled, self.bounds[:-1])
        return np.where(np.isneginf(out), np.nan, out)


def _statistics(traits: tuple[JobTraits, ...], resource: Resource) -> npt.NDArray[np.int8]:
    return statistic_codes(
        [statistic_for(JobProfile(resource, t.job_class, t.latency, t.oom_tolerance)) for t in traits]
    )


class PipelineSetter:
    """A :class:`VerticalRecommender` fed each window's per-job histogram."""

    def __init__(self, recommender: VerticalRecommender, layout: ChunkLayout, settings: JobSettings) -> None:
        self.recommender = recommender
        self.layout = layout
        self.settings = settings
        self.state: RecommenderState = recommender.initial_state(layout.jobs)
        self.boundaries = recommender.scheme.boundaries
        self.buckets = recommender.scheme.size

    def _bucket(self, values: FloatArray) -> IntpArray:
        index = np.searchsorted(self.boundaries, values, side="right")
        return np.asarray(np.minimum(index, self.buckets - 1), dtype=np.intp)

    def counts(self, obs: Observation) -> FloatArray:
        jobs, k = self.layout.jobs, self.buckets
        if obs.points is None:
            run = np.flatnonzero(obs.running)
            flat = self.layout.job_of_task[run] * k + self._bucket(obs.observed[run])
            return np.asarray(np.bincount(flat, minlength=jobs * k).reshape(jobs, k), dtype=np.float64)
        assert obs.fractions is not None
        run = np.flatnonzero(obs.running)
        points = obs.points[run]
        flat = (self.layout.job_of_task[run][:, None] * k + self._bucket(points)).ravel()
        # 300 one-second samples per window (§3.2.1), spread over the window's points.
        weights = (obs.fractions[run] * (WINDOW_MS / 1000.0)).ravel()
        return np.asarray(
            np.bincount(flat, weights=weights, minlength=jobs * k).reshape(jobs, k), dtype=np.float64
        )

    def step(self, obs: Observation) -> FloatArray:
        times = np.full(self.layout.jobs, obs.time_ms, dtype=np.int64)
        self.state, batch = self.recommender.update_batch(self.state, self.counts(obs), times, self.settings)
        return np.asarray(batch.value, dtype=np.float64)


def moving_window_setter(layout: ChunkLayout, resource: Resource) -> PipelineSetter:
    recommender = moving_window_recommender(JobProfile(resource))
    settings = JobSettings(statistic=_statistics(layout.traits, resource))
    return PipelineSetter(recommender, layout, settings)


def ml_setter(layout: ChunkLayout, resource: Resource, config: EnsembleConfig) -> PipelineSetter:
    return PipelineSetter(ml_recommender(resource, config=config), layout, JobSettings())


class VpaSetter:
    """VPA's recommender (memory: per-task interval peaks and OOM bump-ups; CPU: all samples)
    plus its updater's decision of when to resize."""

    def __init__(self, layout: ChunkLayout, resource: Resource, config: VpaConfig) -> None:
        self.layout = layout
        self.config = config
        self.vpa = VpaRecommender("memory" if resource is Resource.MEMORY else "cpu", config)
        self.state = self.vpa.initial_state(layout.jobs, int(layout.bounds[-1]))
        self.last_update_ms = np.full(layout.jobs, np.iinfo(np.int64).min // 2, dtype=np.int64)
        self.decided = np.full(layout.jobs, np.nan)
        self.previous_oom = np.zeros(int(layout.bounds[-1]), dtype=bool)

    def step(self, obs: Observation) -> FloatArray:
        layout = self.layout
        run = np.flatnonzero(obs.running)
        if obs.points is None:
            self.vpa.add_memory_samples(self.state, layout.job_of_task, run, obs.observed[run], obs.time_ms)
            oom = np.flatnonzero(obs.oom)
            self.vpa.record_ooms(self.state, layout.job_of_task, oom, obs.task_limit[oom], obs.time_ms)
        else:
            assert obs.fractions is not None
            p = obs.points.shape[1]
            jobs = np.repeat(layout.job_of_task[run], p)
            request = np.repeat(obs.task_limit[run], p)
            self.vpa.add_cpu_samples(
                self.state,
                jobs,
                obs.points[run].ravel(),
                obs.fractions[run].ravel(),
                np.where(np.isnan(request), 0.0, request),
                obs.time_ms,
            )
        estimate = self.vpa.estimate(self.state)
        current = np.where(np.isnan(self.decided), layout.per_job_max(obs.task_limit), self.decided)
        # A quick OOM: the task OOMs again within evict-after-oom-threshold (10 min) of its
        # OOM restart, i.e. in two consecutive 5-minute windows.
        quick = obs.oom & self.previous_oom
        self.previous_oom = obs.oom.copy()
        quick_job = np.bincount(layout.job_of_task[quick], minlength=layout.jobs) > 0
        since = obs.time_ms - self.last_update_ms
        update = updater_decision(self.config, current, estimate, since, quick_job)
        self.last_update_ms[update] = obs.time_ms
        self.decided[update] = estimate.target[update]
        return np.where(update, estimate.target, np.nan)


class ManualSetter:
    """The owner of a manually-limited job: returns a raised floor for the job's limit, or NaN."""

    def __init__(self, layout: ChunkLayout, response: ManualResponse) -> None:
        self.layout = layout
        self.response = response
        jobs = layout.jobs
        self.ooms = np.zeros((jobs, WINDOWS_PER_DAY), dtype=np.int64)
        self.peaks = np.full((jobs, WINDOWS_PER_DAY), np.nan)
        self.due = np.full(jobs, -1, dtype=np.int64)
        self.last_response = np.full(jobs, np.iinfo(np.int64).min // 2, dtype=np.int64)
        self.floor = np.full(jobs, np.nan)

    def step(self, obs: Observation) -> FloatArray:
        layout, r = self.layout, self.response
        slot = obs.window % WINDOWS_PER_DAY
        self.ooms[:, slot] = np.bincount(layout.job_of_task[obs.oom], minlength=layout.jobs)
        self.peaks[:, slot] = layout.per_job_max(np.where(obs.running, obs.observed, np.nan))
        tasks = np.bincount(layout.job_of_task[obs.running], minlength=layout.jobs)
        trailing = self.ooms.sum(axis=1)
        threshold = np.maximum(r.alert_ooms, r.alert_fraction * tasks)
        cooldown = obs.window - self.last_response >= r.cooldown_ms // WINDOW_MS
        alert = (trailing >= threshold) & (trailing > 0) & (self.due < 0) & cooldown
        self.due[alert] = obs.window + max(1, r.response_ms // WINDOW_MS)
        act = self.due == obs.window
        out = np.full(layout.jobs, np.nan)
        if act.any():
            with np.errstate(all="ignore"):
                seen = np.nanmax(self.peaks[act], axis=1)
            current = layout.per_job_max(obs.task_limit)[act]
            raised = r.raise_factor * np.fmax(current, seen)
            self.floor[act] = raised
            out[act] = raised
            self.due[act] = -1
            self.last_response[act] = obs.window
        return out
