"""Every registered recommender's output for a batch of jobs, from one shared state per resource.

A recommender worker (Autopilot §3.1: "each of Autopilot's resource recommenders ... runs
as a separate job") keeps, per job and resource, the state of every applicable
recommender and emits all their outputs so the Autopilot master can choose (§3.2) and
users can compare them, also for jobs that are not Autopiloted (§5.2).

Recommenders compose (:mod:`cellpilot.recommend.estimator`): a recommender kind is an
estimator over the per-job states every kind shares, with its decorators, registered in
:mod:`cellpilot.autopilot.recommender_registry`. One batch step folds the window into the
shared states the computed kinds read (the decayed histogram of §3.2.2, the ensemble of
§3.2.3), asks every kind for its estimate, and holds each at its own maximum over the last
hour (§3.2.2 post-processing, one ring per kind). The built-in registry gives:

* the six moving-window recommenders of §3.2.2 (S_max, S_avg, S_p90, S_p95, S_p98 and
  max(S_p60, 0.5 S_max)), each with the safety margin;
* the ML recommender of §3.2.3 (ensemble of arg-min models, eqs. 4-9; its margins are
  per model, eq. 7).

User bounds are not applied here: they are configuration, applied by the master.

OOM feedback (issue: "a job that OOMs gets more memory promptly", Figure 9a): an OOM
event at limit L with usage u bumps every memory recommender immediately, through its
max-over-the-last-hour ring, to max(L, u) x (1 + bump); and the bumped value is added as
a sample to the job's next histogram, so the ML model's overrun cost (eq. 4) and S_max
see the overrun the kill hid (the task's own samples stop at the limit).

Horizontal autoscaling's CPU-utilisation source (§3.3) keeps per job a ring of averaging
windows of the job's summed CPU usage; r_S is the max or P95 over each job's own horizon.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np
import numpy.typing as npt

from cellpilot.array_types import BoolArray, FloatArray, Int64Array
from cellpilot.autopilot.recommender_registry import (
    BUILTIN_REGISTRY,
    RecommenderRegistry,
)
from cellpilot.job_vocabulary import HorizontalStatistic, RecommenderKind
from cellpilot.recommend.estimator import Estimator, SharedSource, SharedView
from cellpilot.recommend.horizontal import (
    CpuSourceState,
    CpuUtilisationSource,
    initial_cpu_source,
    update_cpu_source,
)
from cellpilot.recommend.job_arrays import JobArrays
from cellpilot.recommend.ml_ensemble import (
    EnsembleConfig,
    EnsembleState,
    initial_ensemble_state,
    update_ensemble,
)
from cellpilot.recommend.moving_window import (
    WindowConfig,
    WindowState,
    initial_window_state,
    update_window,
)
from cellpilot.recommend.policy import Statistic
from cellpilot.recommend.post_processing import (
    HOUR_MS,
    MINUTE_MS,
    LastHourMax,
    MarginCurve,
    WindowMaxState,
)
from cellpilot.units import GIB, MILLICORES_PER_CORE
from cellpilot.usage.buckets import BucketScheme, Resource, default_scheme

# The built-in moving-window kinds' statistics (the §3.2.2 policy table picks among them),
# from their registrations.
WINDOW_STATISTICS: dict[RecommenderKind, Statistic] = {
    RecommenderKind(r.kind): r.statistic for r in BUILTIN_REGISTRY.registrations if r.statistic is not None
}
WINDOW_KINDS: tuple[RecommenderKind, ...] = tuple(WINDOW_STATISTICS)
NO_TIME = -1
# The unit of the ML ensemble's additive margins (eq. 7), in the histograms' unit per resource:
# one core (in millicores) and one GiB (in bytes).
ML_MARGIN_UNITS: dict[Resource, float] = {
    Resource.CPU: float(MILLICORES_PER_CORE),
    Resource.MEMORY: float(GIB),
}


@dataclass(frozen=True)
class CandidateConfig:
    """How one resource's recommenders are set up (defaults: the paper's, see the modules)."""

    resource: Resource
    scheme: BucketScheme
    window: WindowConfig
    margin: MarginCurve
    ensemble: EnsembleConfig = field(default_factory=EnsembleConfig)
    hour_max_ms: int = HOUR_MS  # §3.2.2: "the maximum recommendation value seen over the last hour"
    hour_max_slot_ms: int = 5 * MINUTE_MS
    # OOM bump: our choice; the paper says only that Autopilot "promptly increased" the limit.
    oom_bump: float = 0.2
    # Which shared states to fold in. A worker folds every one (users compare all kinds, §5.2);
    # a caller that can never select the kinds reading one (a study of the moving window alone)
    # may skip it: those kinds' columns stay NaN and nothing else changes.
    with_window: bool = True
    with_ml: bool = True
    # The recommender kinds, one output column each (registration order).
    registry: RecommenderRegistry = BUILTIN_REGISTRY

    @classmethod
    def for_resource(cls, resource: Resource, ensemble: EnsembleConfig | None = None) -> CandidateConfig:
        ensemble = ensemble or EnsembleConfig()
        # Eq. 7's additive margins M_m are in the resource's unit: one core, one GiB.
        grid = ensemble.grid.with_unit(ML_MARGIN_UNITS[resource])
        return cls(
            resource,
            default_scheme(resource),
            WindowConfig.for_resource(resource),
            MarginCurve.for_resource(resource),
            replace(ensemble, grid=grid),
        )

    @cached_property
    def estimators(self) -> tuple[Estimator, ...]:
        """Every registered kind's estimator with its decorators, in column order."""
        return tuple(r.build(self) for r in self.registry.registrations)

    @property
    def folded_sources(self) -> frozenset[SharedSource]:
        """The shared states this configuration folds windows into."""
        return frozenset(
            source
            for source, wanted in (
                (SharedSource.WINDOW, self.with_window),
                (SharedSource.ENSEMBLE, self.with_ml),
            )
            if wanted
        )

    @property
    def computed_columns(self) -> tuple[int, ...]:
        """The kinds whose shared states are folded in (the others stay NaN)."""
        folded = self.folded_sources
        return tuple(c for c, estimator in enumerate(self.estimators) if estimator.reads <= folded)

    @property
    def hour_max(self) -> LastHourMax:
        return LastHourMax(self.hour_max_ms, self.hour_max_slot_ms)

    @property
    def hour_max_slots(self) -> int:
        return self.hour_max.slots


@dataclass(frozen=True, eq=False)
class CandidateState(JobArrays):
    """One resource's shared per-job states, each kind's ring of the last hour and latest output."""

    window: WindowState  # §3.2.2's decayed histogram (SharedSource.WINDOW)
    ml: EnsembleState  # §3.2.3's ensemble (SharedSource.ENSEMBLE)
    hour_max: tuple[WindowMaxState, ...]  # one per kind, in registration order
    last_end_ms: Int64Array  # (J,) end of the newest histogram folded in; NO_TIME = none
    pending_oom_value: FloatArray  # (J,) bumped value to add to the next histogram; NaN = none
    pending_oom_count: FloatArray  # (J,) samples to add there
    values: FloatArray  # (J, C) latest output per kind (NaN = none yet)


def initial_candidate_state(config: CandidateConfig, jobs: int = 1) -> CandidateState:
    kinds = len(config.registry)
    return CandidateState(
        window=initial_window_state(jobs, config.scheme.size, config.window),
        ml=initial_ensemble_state(jobs, config.scheme.size, config.ensemble),
        hour_max=tuple(config.hour_max.initial(jobs) for _ in range(kinds)),
        last_end_ms=np.full(jobs, NO_TIME, dtype=np.int64),
        pending_oom_value=np.full(jobs, np.nan),
        pending_oom_count=np.zeros(jobs),
        values=np.full((jobs, kinds), np.nan),
    )


@dataclass(frozen=True, eq=False)
class CandidateBatch:
    """Every recommender's output for J jobs (columns in the registry's order)."""

    resource: Resource
    time_ms: Int64Array  # (J,) event time of the input (window end, or OOM time)
    value: FloatArray  # (J, C) recommended limit: raw + margin, held at the max of the last hour
    raw_value: FloatArray  # (J, C) statistic or model limit before the margin
    margin: FloatArray  # (J, C) relative safety margin
    raised_by_window_max: BoolArray  # (J, C)
    ml_model: Int64Array  # (J,) eq. 9's winning model, -1 = none
    ml_cost: FloatArray  # (J,) its decayed cost c_m[t]
    oom_bumped: BoolArray  # (J,) this output reacts to an OOM

    def __len__(self) -> int:
        return int(self.time_ms.shape[0])


def _record(
    config: CandidateConfig, rings: tuple[WindowMaxState, ...], values: FloatArray, time_ms: Int64Array
) -> tuple[tuple[WindowMaxState, ...], FloatArray]:
    """Record each held kind's value in its ring; (new rings, max over the last hour per kind).

    The rings of kinds not computed, or not held at the hour's max, stay as they are (their
    maxima are NaN)."""
    new_rings = list(rings)
    maxima = np.full_like(values, np.nan)
    registrations = config.registry.registrations
    for c in config.computed_columns:
        if registrations[c].hour_max:
            new_rings[c], maxima[:, c] = config.hour_max.record(rings[c], values[:, c], time_ms)
    return tuple(new_rings), maxima


def _fold_shared(
    config: CandidateConfig, state: CandidateState, counts: FloatArray, end_ms: Int64Array
) -> tuple[WindowState, EnsembleState, SharedView]:
    """Fold one window into each shared state some computed kind reads; what they read."""
    boundaries = config.scheme.boundaries
    read = frozenset().union(*(config.estimators[c].reads for c in config.computed_columns))
    window_state, statistics = state.window, None
    if SharedSource.WINDOW in read:
        window_state, statistics = update_window(config.window, boundaries, state.window, counts, end_ms)
    ml_state, decision = state.ml, None
    if SharedSource.ENSEMBLE in read:
        ml_state, decision = update_ensemble(config.ensemble, boundaries, state.ml, counts, end_ms)
    view = SharedView(
        counts,
        end_ms,
        boundaries,
        window=statistics,
        ensemble=None if decision is None else ml_state,
        decision=decision,
    )
    return window_state, ml_state, view


def update_candidates(
    config: CandidateConfig, state: CandidateState, counts: npt.ArrayLike, end_ms: npt.ArrayLike
) -> tuple[CandidateState, CandidateBatch]:
    """Fold one job histogram per job (``counts`` (J, K), window ends (J,)), in event-time order."""
    s = np.array(counts, dtype=np.float64, copy=True)
    t = np.asarray(end_ms, dtype=np.int64)
    jobs = state.last_end_ms.shape[0]
    if s.shape != (jobs, config.scheme.size) or t.shape != (jobs,):
        raise ValueError(f"expected counts ({jobs}, {config.scheme.size}) and end times ({jobs},)")
    pending = ~np.isnan(state.pending_oom_value)
    if pending.any():
        rows = np.flatnonzero(pending)
        s[rows, config.scheme.index_of(state.pending_oom_value[rows])] += state.pending_oom_count[rows]

    window_state, ml_state, view = _fold_shared(config, state, s, t)
    raw = np.full((jobs, len(config.registry)), np.nan)
    with_margin = np.full_like(raw, np.nan)
    margin = np.full_like(raw, np.nan)
    ml_model = np.full(jobs, -1, dtype=np.int64)
    ml_cost = np.full(jobs, np.nan)
    for c in config.computed_columns:
        estimate = config.estimators[c].estimate(view)
        raw[:, c], with_margin[:, c], margin[:, c] = estimate.raw, estimate.limit, estimate.margin
        if estimate.model is not None:  # the kind that explains itself by a model (§3.2.3)
            ml_model = estimate.model
            ml_cost = estimate.cost if estimate.cost is not None else np.full(jobs, np.nan)

    # §3.2.2 post-processing: the max over the last hour, per kind.
    rings, maxima = _record(config, state.hour_max, with_margin, t)
    value = np.fmax(with_margin, maxima)
    raised = maxima > with_margin
    new_state = CandidateState(
        window=window_state,
        ml=ml_state,
        hour_max=rings,
        last_end_ms=t.copy(),
        pending_oom_value=np.full(jobs, np.nan),
        pending_oom_count=np.zeros(jobs),
        values=value,
    )
    batch = CandidateBatch(
        resource=config.resource,
        time_ms=t.copy(),
        value=value,
        raw_value=raw,
        margin=margin,
        raised_by_window_max=raised,
        ml_model=ml_model,
        ml_cost=ml_cost,
        oom_bumped=pending,
    )
    return new_state, batch


def oom_bumped_value(config: CandidateConfig, limit: npt.ArrayLike, usage: npt.ArrayLike) -> FloatArray:
    """max(limit at the kill, usage at the kill) raised by ``oom_bump`` (0 / unknown ignored)."""
    lim = np.asarray(limit, dtype=np.float64)
    use = np.asarray(usage, dtype=np.float64)
    base = np.fmax(np.where(lim > 0, lim, np.nan), np.where(use > 0, use, np.nan))
    return np.asarray(base * (1.0 + config.oom_bump), dtype=np.float64)


def apply_oom(
    config: CandidateConfig, state: CandidateState, bumped: npt.ArrayLike, time_ms: npt.ArrayLike
) -> tuple[CandidateState, CandidateBatch]:
    """React to one OOM per job: every recommender's value rises to at least ``bumped`` now.

    Jobs whose ``bumped`` is NaN (nothing known about the kill) are unchanged.
    """
    v = np.asarray(bumped, dtype=np.float64)
    t_in = np.asarray(time_ms, dtype=np.int64)
    jobs = state.last_end_ms.shape[0]
    if v.shape != (jobs,) or t_in.shape != (jobs,):
        raise ValueError(f"expected ({jobs},) bumped values and times")
    known = ~np.isnan(v)
    # Never record before the newest histogram: the rings hold the last hour up to it.
    t = np.maximum(t_in, state.last_end_ms)
    values = np.where(known[:, None], np.fmax(state.values, v[:, None]), np.nan)
    rings, maxima = _record(config, state.hour_max, values, t)
    value = np.where(known[:, None], np.fmax(values, maxima), state.values)
    pending_value = np.where(known, np.fmax(state.pending_oom_value, v), state.pending_oom_value)
    pending_count = state.pending_oom_count + known
    new_state = replace(
        state,
        hour_max=rings,
        pending_oom_value=pending_value,
        pending_oom_count=pending_count,
        values=value,
    )
    raw = np.where(known[:, None], v[:, None], np.nan) * np.ones((1, len(config.registry)))
    batch = CandidateBatch(
        resource=config.resource,
        time_ms=t,
        value=value,
        raw_value=raw,
        margin=np.zeros_like(value),
        raised_by_window_max=np.zeros_like(value, dtype=bool),
        ml_model=np.where(known, state.ml.model, -1).astype(np.int64),
        ml_cost=np.full(jobs, np.nan),
        oom_bumped=known,
    )
    return new_state, batch


# -- horizontal: the CPU-utilisation signal (§3.3) -------------------------------------


@dataclass(frozen=True)
class UsageSignalConfig:
    """Ring of averaging windows long enough for the longest horizon any job may ask for."""

    averaging_window_ms: int = 5 * MINUTE_MS  # §3.3 default averaging window
    max_horizon_ms: int = 72 * HOUR_MS  # §3.3 default horizon T

    @property
    def source(self) -> CpuUtilisationSource:
        return CpuUtilisationSource(1.0, self.averaging_window_ms, self.max_horizon_ms)


def initial_usage_signal(config: UsageSignalConfig, jobs: int = 1) -> CpuSourceState:
    return initial_cpu_source(jobs, config.source)


def update_usage_signal(
    config: UsageSignalConfig,
    state: CpuSourceState,
    total_usage: npt.ArrayLike,
    time_ms: npt.ArrayLike,
    horizon_ms: npt.ArrayLike,
    statistic: npt.ArrayLike,
) -> tuple[CpuSourceState, FloatArray]:
    """Add one sum_i r_i sample per job; r_S[t] over each job's horizon (max or P95).

    ``statistic`` is a (J,) array of :class:`HorizontalStatistic` values; horizons are capped at
    the configured maximum.
    """
    usage = np.asarray(total_usage, dtype=np.float64)
    t = np.asarray(time_ms, dtype=np.int64)
    new_state, _, _ = update_cpu_source(config.source, state, usage, t, 1.0)
    slots = new_state.slot_ids.shape[1]
    horizon_slots = np.clip(
        -(-np.asarray(horizon_ms, dtype=np.int64) // config.averaging_window_ms), 1, slots
    )
    window = t // config.averaging_window_ms
    valid = new_state.slot_ids > (window - horizon_slots)[:, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        averages = np.where(valid, new_state.sums / new_state.samples, np.nan)
    wants_p95 = np.asarray(statistic) == HorizontalStatistic.P95
    r_max = np.nanmax(averages, axis=1)
    ordered = np.sort(averages, axis=1)  # NaN last
    count = np.sum(~np.isnan(averages), axis=1)
    rank = np.maximum(np.ceil(count * 0.95).astype(np.intp) - 1, 0)
    r_p95 = ordered[np.arange(ordered.shape[0]), rank]
    return new_state, np.where(wants_p95, r_p95, r_max)
