"""The deciders compared in the closed-loop replay: Autopilot as the services run it,
manual limits, VPA, and the clairvoyant bound.

Each decider sees one 5-minute window of a chunk of jobs at a time (what the monitoring
reports: every running task's observed usage, its OOMs, its current limit) and returns, per
job, the limit it wants applied from now on (NaN: no change). The replay
(:mod:`cellpilot.evaluate.autopilot_replay`) applies it after the actuation delay and
enforces it.

* **Autopilot** (:class:`AutopilotDecider`): the services' own decision core, batched over
  the chunk's jobs. Per window: the job histogram s[t] = sum over tasks of s_i[t] (§3.2.1:
  one sample per running task at its window peak for memory, the window's usage
  distribution for CPU) goes through the recommender worker's
  :func:`~cellpilot.autopilot.candidates.update_candidates` (every moving-window statistic
  and the ML ensemble, margins, max over the last hour), after the worker's OOM reaction
  (:func:`~cellpilot.autopilot.candidates.apply_oom`); then the master's recommender
  selection (:func:`~cellpilot.autopilot.selection.select_recommender`, AUTO included) and
  its vertical step (:func:`~cellpilot.autopilot.vertical_targets.vertical_targets`:
  bounds, largest machine, dead band). The compared "moving-window" and "ml" rows are this
  decider with the recommender fixed (AUTO by the §3.2.2 table, or ML); "autopilot" is
  AUTO as the master is configured.
* **manual** (§4): the owner's limits from the workload; the owner reacts only to an OOM
  alert (see :class:`ManualResponse`), by raising the job's limit by hand.
* **VPA**: :class:`cellpilot.evaluate.vpa.VpaRecommender` plus its updater's rule for when
  to resize.
* **clairvoyant**: the bound (:mod:`cellpilot.evaluate.autopilot_bound`). It knows the
  job's usage ahead and sets, per window, the least limit that kills none of its tasks for
  its limit, never below the day's p95 usage (so its relative slack is >= 0); soft by
  default, like the Autopilot rows it bounds (``clairvoyant:hard``: no task ever over its
  limit). The replay applies it without delay.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Protocol

import numpy as np

from cellpilot.array_types import BoolArray, FloatArray, IntpArray
from cellpilot.autopilot.candidates import (
    CandidateConfig,
    apply_oom,
    initial_candidate_state,
    oom_bumped_value,
    update_candidates,
)
from cellpilot.autopilot.decisions import DecisionPolicy
from cellpilot.autopilot.ml_config import ML_HYPERPARAMETERS
from cellpilot.autopilot.recommender_registry import BUILTIN_RECOMMENDERS
from cellpilot.autopilot.selection import (
    AUTO,
    AutoMl,
    RecommenderRef,
    VerticalConfig,
    select_recommender,
)
from cellpilot.autopilot.selection import (
    JobTraits as SelectionTraits,
)
from cellpilot.autopilot.vertical_targets import chosen_values, vertical_targets
from cellpilot.evaluate.vpa import VpaConfig, VpaRecommender, updater_decision
from cellpilot.job_vocabulary import RecommenderKind, ScalingMode
from cellpilot.recommend.ml_ensemble import EnsembleConfig
from cellpilot.usage.buckets import Resource
from cellpilot.workloads.task_signals import WINDOW_MS, WINDOWS_PER_DAY, JobTraits


class PolicyKind(StrEnum):
    MANUAL = "manual"
    MOVING_WINDOW = "moving-window"  # Autopilot, AUTO by the §3.2.2 table
    ML = "ml"  # Autopilot, the ML recommender chosen
    AUTOPILOT = "autopilot"  # Autopilot, AUTO as the master is configured
    VPA = "vpa"
    CLAIRVOYANT = "clairvoyant"  # the bound

    @property
    def is_autopilot(self) -> bool:
        return self in (PolicyKind.MOVING_WINDOW, PolicyKind.ML, PolicyKind.AUTOPILOT)


class Enforcement(StrEnum):
    """How a RAM limit is enforced (§2.3): hard = OOM at the limit; soft = only under machine pressure."""

    HARD = "hard"
    SOFT = "soft"


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
    "clairvoyant": RecommenderSpec("clairvoyant", PolicyKind.CLAIRVOYANT, Enforcement.SOFT),
}
# Named but not in every study: AUTO as the master runs it (per job the window or ML).
EXTRA_RECOMMENDERS: dict[str, RecommenderSpec] = {
    "autopilot": RecommenderSpec("autopilot", PolicyKind.AUTOPILOT, Enforcement.SOFT),
}
KNOWN_RECOMMENDERS = {**STANDARD_RECOMMENDERS, **EXTRA_RECOMMENDERS}


def parse_recommenders(text: str) -> tuple[RecommenderSpec, ...]:
    """``"manual-hard,ml,vpa:hard"``: standard names, optionally ``:hard`` / ``:soft`` enforcement."""
    specs: list[RecommenderSpec] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, _, enforcement = item.partition(":")
        if name not in KNOWN_RECOMMENDERS:
            raise ValueError(f"unknown recommender {name!r} (known: {', '.join(KNOWN_RECOMMENDERS)})")
        spec = KNOWN_RECOMMENDERS[name]
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


class Decider(Protocol):
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


def job_histograms(layout: ChunkLayout, config: CandidateConfig, obs: Observation) -> FloatArray:
    """s[t] per job in the recommender's bucket scheme (§3.2.1), as the aggregator sums it:
    memory, one sample per running task at its window peak; CPU, 300 one-second samples per
    task spread over the window's usage points."""
    jobs, k = layout.jobs, config.scheme.size
    run = np.flatnonzero(obs.running)
    if obs.points is None:
        flat = layout.job_of_task[run] * k + config.scheme.index_of(obs.observed[run])
        return np.asarray(np.bincount(flat, minlength=jobs * k).reshape(jobs, k), dtype=np.float64)
    assert obs.fractions is not None
    points = obs.points[run]
    flat = (layout.job_of_task[run][:, None] * k + config.scheme.index_of(points)).ravel()
    weights = (obs.fractions[run] * (WINDOW_MS / 1000.0)).ravel()
    return np.asarray(
        np.bincount(flat, weights=weights, minlength=jobs * k).reshape(jobs, k), dtype=np.float64
    )


def selected_columns(
    kind: PolicyKind, layout: ChunkLayout, resource: Resource, policy: DecisionPolicy
) -> IntpArray:
    """Per job the candidate column the master selects (the same :func:`select_recommender`)."""
    ref = RecommenderRef.builtin(RecommenderKind.ML) if kind is PolicyKind.ML else RecommenderRef(AUTO)
    auto_ml = policy.auto_ml if kind is PolicyKind.AUTOPILOT else AutoMl.NEVER
    config = VerticalConfig(mode=ScalingMode.ON, recommender=ref)
    columns = []
    for t in layout.traits:
        traits = SelectionTraits(t.job_class, t.latency, t.oom_tolerance)
        chosen = select_recommender(resource, config, traits, (), auto_ml).ref
        columns.append(BUILTIN_RECOMMENDERS.index(RecommenderKind(chosen.kind)))
    return np.asarray(columns, dtype=np.intp)


class AutopilotDecider:
    """The recommender worker's and the master's code on a chunk's jobs (module docstring)."""

    def __init__(
        self,
        kind: PolicyKind,
        layout: ChunkLayout,
        resource: Resource,
        ensemble: EnsembleConfig,
        policy: DecisionPolicy,
    ) -> None:
        self.layout = layout
        self.resource = resource
        self.policy = policy
        self.columns = selected_columns(kind, layout, resource, policy)
        ml = BUILTIN_RECOMMENDERS.index(RecommenderKind.ML)
        self.config = replace(
            CandidateConfig.for_resource(resource, ensemble),
            with_window=bool(np.any(self.columns != ml)),
            with_ml=bool(np.any(self.columns == ml)),
        )
        self.state = initial_candidate_state(self.config, layout.jobs)
        # Per job, the limit the master wants after the latest window (bounded, whole units of
        # the master, NaN before the first recommendation), actuated or not (the dead band).
        self.wanted = np.full(layout.jobs, np.nan)

    def _react_to_ooms(self, obs: Observation) -> None:
        """The worker's OOM feedback: one :func:`apply_oom` round per OOM of a job."""
        oom = np.flatnonzero(obs.oom)
        job = self.layout.job_of_task[oom]
        order = np.argsort(job, kind="stable")
        oom, job = oom[order], job[order]
        first = np.searchsorted(job, job)
        rank = np.arange(job.size) - first
        bumped_all = oom_bumped_value(self.config, obs.task_limit[oom], obs.observed[oom])
        for r in range(int(rank.max()) + 1):
            this = rank == r
            bumped = np.full(self.layout.jobs, np.nan)
            bumped[job[this]] = bumped_all[this]
            times = np.full(self.layout.jobs, obs.time_ms - 1, dtype=np.int64)
            self.state, _ = apply_oom(self.config, self.state, bumped, times)

    def step(self, obs: Observation) -> FloatArray:
        if obs.oom.any():
            self._react_to_ooms(obs)
        times = np.full(self.layout.jobs, obs.time_ms, dtype=np.int64)
        counts = job_histograms(self.layout, self.config, obs)
        self.state, batch = update_candidates(self.config, self.state, counts, times)
        chosen, raised = chosen_values(batch.value, batch.raised_by_window_max, self.columns)
        current = np.where(np.isnan(obs.job_limit), self.layout.per_job_max(obs.task_limit), obs.job_limit)
        targets = vertical_targets(
            chosen,
            raised,
            current,
            on=True,
            machine_capacity=self.policy.machine(self.resource),
            min_increase=self.policy.min_increase_fraction,
            min_decrease=self.policy.min_decrease_fraction,
        )
        self.wanted = targets.value
        return np.where(targets.actuate, targets.value, np.nan)


class VpaDecider:
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
            tasks = np.repeat(run, obs.points.shape[1])
            self.vpa.add_cpu_samples(
                self.state,
                layout.job_of_task,
                tasks,
                obs.points[run].ravel(),
                obs.fractions[run].ravel(),
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


class ManualDecider:
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
