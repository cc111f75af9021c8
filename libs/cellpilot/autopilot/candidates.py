"""Every built-in recommender's output for a batch of jobs, from one shared state per resource.

A recommender worker (Autopilot §3.1: "each of Autopilot's resource recommenders ... runs
as a separate job") keeps, per job and resource, the state of every applicable
recommender and emits all their outputs so the Autopilot master can choose (§3.2) and
users can compare them, also for jobs that are not Autopiloted (§5.2):

* the six moving-window recommenders of §3.2.2 (S_max, S_avg, S_p90, S_p95, S_p98 and
  max(S_p60, 0.5 S_max)) share one :class:`~cellpilot.recommend.moving_window.WindowState`:
  one decayed histogram serves every statistic. Each gets the safety margin and its own
  maximum over the last hour (§3.2.2 post-processing);
* the ML recommender of §3.2.3 (ensemble of arg-min models, eqs. 4-9; its margins are
  per model, eq. 7), with its own maximum over the last hour.

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

import numpy as np
import numpy.typing as npt

from cellpilot.array_types import BoolArray, FloatArray, Int64Array
from cellpilot.job_vocabulary import BUILTIN_RECOMMENDERS, HorizontalStatistic, RecommenderKind
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
from cellpilot.recommend.policy import Statistic, evaluate_statistics
from cellpilot.recommend.post_processing import (
    HOUR_MS,
    MINUTE_MS,
    MarginCurve,
    WindowMaxState,
    initial_window_max,
    update_window_max,
)
from cellpilot.units import GIB, MILLICORES_PER_CORE
from cellpilot.usage.buckets import BucketScheme, Resource, default_scheme

WINDOW_STATISTICS: dict[RecommenderKind, Statistic] = {
    RecommenderKind.MOVING_WINDOW_MAX: Statistic.MAX,
    RecommenderKind.MOVING_WINDOW_AVG: Statistic.AVG,
    RecommenderKind.MOVING_WINDOW_P90: Statistic.P90,
    RecommenderKind.MOVING_WINDOW_P95: Statistic.P95,
    RecommenderKind.MOVING_WINDOW_P98: Statistic.P98,
    RecommenderKind.MOVING_WINDOW_P60_HALF_MAX: Statistic.MAX_OF_P60_AND_HALF_PEAK,
}
WINDOW_KINDS: tuple[RecommenderKind, ...] = tuple(WINDOW_STATISTICS)
STATISTIC_NAMES: dict[RecommenderKind, str] = {
    RecommenderKind.MOVING_WINDOW_MAX: "S_max",
    RecommenderKind.MOVING_WINDOW_AVG: "S_avg",
    RecommenderKind.MOVING_WINDOW_P90: "S_p90",
    RecommenderKind.MOVING_WINDOW_P95: "S_p95",
    RecommenderKind.MOVING_WINDOW_P98: "S_p98",
    RecommenderKind.MOVING_WINDOW_P60_HALF_MAX: "max(S_p60, 0.5*S_max)",
}
_ML = BUILTIN_RECOMMENDERS.index(RecommenderKind.ML)
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
    # Which outputs to compute. A worker computes every one (users compare them, §5.2); a
    # caller that can never select a group (a study of the moving window alone) may skip it:
    # its columns stay NaN and nothing else changes.
    with_window: bool = True
    with_ml: bool = True

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

    @property
    def computed_columns(self) -> tuple[int, ...]:
        return tuple(
            c
            for c, kind in enumerate(BUILTIN_RECOMMENDERS)
            if (self.with_ml if kind is RecommenderKind.ML else self.with_window)
        )

    @property
    def hour_max_slots(self) -> int:
        return -(-self.hour_max_ms // self.hour_max_slot_ms)


@dataclass(frozen=True, eq=False)
class CandidateState(JobArrays):
    window: WindowState
    ml: EnsembleState
    hour_max: tuple[WindowMaxState, ...]  # one per kind, in BUILTIN_RECOMMENDERS order
    last_end_ms: Int64Array  # (J,) end of the newest histogram folded in; NO_TIME = none
    pending_oom_value: FloatArray  # (J,) bumped value to add to the next histogram; NaN = none
    pending_oom_count: FloatArray  # (J,) samples to add there
    values: FloatArray  # (J, C) latest output per kind (NaN = none yet)


def initial_candidate_state(config: CandidateConfig, jobs: int = 1) -> CandidateState:
    kinds = len(BUILTIN_RECOMMENDERS)
    return CandidateState(
        window=initial_window_state(jobs, config.scheme.size, config.window),
        ml=initial_ensemble_state(jobs, config.scheme.size, config.ensemble),
        hour_max=tuple(initial_window_max(jobs, config.hour_max_slots) for _ in BUILTIN_RECOMMENDERS),
        last_end_ms=np.full(jobs, NO_TIME, dtype=np.int64),
        pending_oom_value=np.full(jobs, np.nan),
        pending_oom_count=np.zeros(jobs),
        values=np.full((jobs, kinds), np.nan),
    )


@dataclass(frozen=True, eq=False)
class CandidateBatch:
    """Every recommender's output for J jobs (columns in :data:`BUILTIN_RECOMMENDERS` order)."""

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
    """Record each kind's value in its ring; (new rings, max over the last hour per kind).

    The rings of kinds the config does not compute stay as they are (their values are NaN)."""
    new_rings = list(rings)
    maxima = np.full_like(values, np.nan)
    for c in config.computed_columns:
        new_ring, window_max = update_window_max(rings[c], values[:, c], time_ms, config.hour_max_slot_ms)
        new_rings[c] = new_ring
        maxima[:, c] = window_max
    return tuple(new_rings), maxima


def update_candidates(
    config: CandidateConfig, state: CandidateState, counts: npt.ArrayLike, end_ms: npt.ArrayLike
) -> tuple[CandidateState, CandidateBatch]:
    """Fold one job histogram per job (``counts`` (J, K), window ends (J,)), in event-time order."""
    s = np.array(counts, dtype=np.float64, copy=True)
    t = np.asarray(end_ms, dtype=np.int64)
    jobs = state.last_end_ms.shape[0]
    if s.shape != (jobs, config.scheme.size) or t.shape != (jobs,):
        raise ValueError(f"expected counts ({jobs}, {config.scheme.size}) and end times ({jobs},)")
    boundaries = config.scheme.boundaries
    pending = ~np.isnan(state.pending_oom_value)
    if pending.any():
        rows = np.flatnonzero(pending)
        s[rows, config.scheme.index_of(state.pending_oom_value[rows])] += state.pending_oom_count[rows]

    raw = np.full((jobs, len(BUILTIN_RECOMMENDERS)), np.nan)
    with_margin = np.full_like(raw, np.nan)
    margin = np.full_like(raw, np.nan)
    window_state = state.window
    if config.with_window:
        window_state, stats = update_window(config.window, boundaries, state.window, s, t)
        for c, kind in enumerate(WINDOW_KINDS):
            raw[:, c], _ = evaluate_statistics(np.full(jobs, WINDOW_STATISTICS[kind], np.int8), stats)
        # §3.2.2 post-processing: the safety margin, then (below) the max over the last hour.
        with_margin[:, :_ML], margin[:, :_ML] = config.margin.apply(raw[:, :_ML])

    ml_state = state.ml
    ml_model = np.full(jobs, -1, dtype=np.int64)
    ml_cost = np.full(jobs, np.nan)
    if config.with_ml:
        ml_state, decision = update_ensemble(config.ensemble, boundaries, state.ml, s, t)
        has_usage = ml_state.smoothed[:, 0, :].sum(axis=1) > 0.0
        raw[:, _ML] = np.where(has_usage, decision.raw_limit, np.nan)
        with_margin[:, _ML] = np.where(has_usage, decision.limit, np.nan)
        with np.errstate(divide="ignore", invalid="ignore"):
            relative = decision.limit / decision.raw_limit - 1.0
        margin[:, _ML] = np.where(has_usage, relative, np.nan)
        ml_model = np.where(has_usage, decision.model, -1).astype(np.int64)
        ml_cost = np.where(has_usage, decision.cost, np.nan)

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
    raw = np.where(known[:, None], v[:, None], np.nan) * np.ones((1, len(BUILTIN_RECOMMENDERS)))
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
