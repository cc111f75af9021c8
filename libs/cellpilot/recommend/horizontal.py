"""Horizontal autoscaling of Autopilot §3.3: raw task-count sources and four stabilisers.

Sources of the raw recommendation n_r[t]:

* :class:`CpuUtilisationSource`: the statistic S (max or P95) of the job's total CPU usage
  sum_i r_i averaged over windows of ``averaging_window_ms`` (default 5 min), over the last
  horizon T (default 72 h): r_S[t]; then n_r[t] = r_S[t] / r*. We read the paper's target
  average utilisation r* as a utilisation *fraction* of the per-task CPU limit, so the
  per-task target usage is r* x limit and n_r = ceil(r_S / (r* x limit)).
* :class:`TargetSizeSource`: a user-supplied function of monitored signals, n_r[t] = f[t].

Stabilisers turning n_r into what to request now (:func:`stabilise`), in order:

1. deferred downscaling: n_s[t] = max of the raw recommendations over the last T_d, so up
   is immediate and down waits T_d;
2. defer small changes: keep the current count when |n_s - n| is small;
3. limiting growth: at most a fraction of the job's tasks may be initialising, which caps
   how many tasks can be added now;
4. slow decay: when n > n_s, remove tasks every 5 minutes so that the count halves over
   a period (default 1 h) until it reaches n_s.

All vectorised over jobs, state in per-job arrays, event time passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np
import numpy.typing as npt

from cellpilot.array_types import FloatArray, Int8Array, Int64Array
from cellpilot.job_vocabulary import HorizontalStatistic
from cellpilot.recommend.job_arrays import JobArrays
from cellpilot.recommend.post_processing import (
    EMPTY_SLOT,
    WindowMaxState,
    initial_window_max,
    update_window_max,
)

MINUTE_MS = 60 * 1000
HOUR_MS = 60 * MINUTE_MS


@dataclass(frozen=True)
class CpuUtilisationSource:
    """§3.3 CPU-utilisation source; defaults: 5-minute averaging, 72 h horizon, max."""

    target_utilisation: float  # r*, a fraction of the per-task CPU limit
    averaging_window_ms: int = 5 * MINUTE_MS
    horizon_ms: int = 72 * HOUR_MS
    statistic: HorizontalStatistic = HorizontalStatistic.MAX

    def __post_init__(self) -> None:
        if self.target_utilisation <= 0.0:
            raise ValueError("target utilisation must be positive")
        if self.averaging_window_ms <= 0 or self.horizon_ms < self.averaging_window_ms:
            raise ValueError("need 0 < averaging window <= horizon")

    @property
    def slots(self) -> int:
        return -(-self.horizon_ms // self.averaging_window_ms)


@dataclass(frozen=True, eq=False)
class CpuSourceState(JobArrays):
    """Per job a ring of averaging windows: which window each entry holds, its sum and count."""

    slot_ids: Int64Array  # (J, S), EMPTY_SLOT = empty
    sums: FloatArray  # (J, S)
    samples: Int64Array  # (J, S)


def initial_cpu_source(jobs: int, source: CpuUtilisationSource) -> CpuSourceState:
    shape = (jobs, source.slots)
    return CpuSourceState(
        np.full(shape, EMPTY_SLOT, dtype=np.int64), np.zeros(shape), np.zeros(shape, dtype=np.int64)
    )


def update_cpu_source(
    source: CpuUtilisationSource,
    state: CpuSourceState,
    total_usage: npt.ArrayLike,
    time_ms: npt.ArrayLike,
    task_cpu_limit: npt.ArrayLike,
) -> tuple[CpuSourceState, FloatArray, FloatArray]:
    """Add one sample of sum_i r_i[tau] per job; return (state, r_S[t], raw n_r[t]).

    Samples may come at any rate (every second, or one 5-minute average): each averaging
    window's value is the mean of the samples that fell in it.
    """
    usage = np.asarray(total_usage, dtype=np.float64)
    t = np.asarray(time_ms, dtype=np.int64)
    limit = np.broadcast_to(np.asarray(task_cpu_limit, dtype=np.float64), usage.shape)
    jobs, slots = state.sums.shape
    if usage.shape != (jobs,) or t.shape != (jobs,):
        raise ValueError(f"expected ({jobs},) usage and times")
    if np.any(limit <= 0.0):
        raise ValueError("task CPU limits must be positive")
    window = t // source.averaging_window_ms
    ring = (window % slots).astype(np.intp)
    rows = np.arange(jobs)
    slot_ids, sums, samples = state.slot_ids.copy(), state.sums.copy(), state.samples.copy()
    fresh = slot_ids[rows, ring] != window
    sums[rows, ring] = np.where(fresh, 0.0, sums[rows, ring]) + usage
    samples[rows, ring] = np.where(fresh, 0, samples[rows, ring]) + 1
    slot_ids[rows, ring] = window
    valid = slot_ids > (window - slots)[:, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        averages = np.where(valid, sums / samples, np.nan)
    if source.statistic is HorizontalStatistic.MAX:
        r_s = np.nanmax(averages, axis=1)
    else:
        r_s = _nearest_rank_percentile(averages, 95.0)
    return CpuSourceState(slot_ids, sums, samples), r_s, raw_task_count(r_s, source.target_utilisation, limit)


def raw_task_count(
    r_s: npt.ArrayLike, target_utilisation: float, task_cpu_limit: npt.ArrayLike
) -> FloatArray:
    """n_r[t] = ceil(r_S[t] / (r* x limit)): the tasks that keep each one's mean CPU usage at the
    target share r* of its limit (Autopilot §3.3, the CPU-utilisation source)."""
    r = np.asarray(r_s, dtype=np.float64)
    raw = np.ceil(r / (target_utilisation * np.asarray(task_cpu_limit, dtype=np.float64)) - 1e-9)
    return np.maximum(raw, 0.0)


def _nearest_rank_percentile(values: FloatArray, level: float) -> FloatArray:
    """Per row, the nearest-rank percentile of the non-NaN values (every row has one)."""
    ordered = np.sort(values, axis=1)  # NaN sorts last
    valid = np.sum(~np.isnan(values), axis=1)
    rank = np.maximum(np.ceil(valid * level / 100.0).astype(np.intp) - 1, 0)
    return np.asarray(ordered[np.arange(values.shape[0]), rank], dtype=np.float64)


@dataclass(frozen=True)
class TargetSizeSource:
    """§3.3 target-size source: n_r[t] = f(signals) with a user function of monitored signals.

    ``function`` maps named per-job signal arrays (J,) to task counts (J,); e.g. scale by
    the 95%ile request handling time, or by the filespace a server manages.
    """

    function: Callable[[Mapping[str, FloatArray]], npt.ArrayLike]

    def raw_recommendation(self, signals: Mapping[str, npt.ArrayLike]) -> FloatArray:
        arrays = {name: np.asarray(value, dtype=np.float64) for name, value in signals.items()}
        raw = np.asarray(self.function(arrays), dtype=np.float64)
        if np.any(np.isnan(raw)):
            raise ValueError("the target-size function returned NaN")
        return np.maximum(np.ceil(raw - 1e-9), 0.0)


@dataclass(frozen=True)
class DeferredDownscaling:
    """n_s[t] = max over the last T_d of n_r (§3.3; 40 % of jobs use 2 days, 35 % 3 days)."""

    window_ms: int = 48 * HOUR_MS
    slot_ms: int = 5 * MINUTE_MS

    @property
    def slots(self) -> int:
        return -(-self.window_ms // self.slot_ms)


@dataclass(frozen=True)
class SlowDecay:
    """Remove tasks every ``step_ms`` so the count halves over ``halving_period_ms`` (§3.3: 5 min, 1 h)."""

    halving_period_ms: int = HOUR_MS
    step_ms: int = 5 * MINUTE_MS


@dataclass(frozen=True)
class DeferSmallChanges:
    """Ignore a change when |n_s - n| <= max(min_tasks, min_fraction x n) (threshold ours)."""

    min_fraction: float = 0.05
    min_tasks: int = 0


@dataclass(frozen=True)
class LimitGrowth:
    """At most ``max_initialising_fraction`` of the tasks initialising (but ``min_initialising`` allowed)."""

    max_initialising_fraction: float = 0.1
    min_initialising: int = 1


@dataclass(frozen=True)
class StabiliserConfig:
    """Which stabilisers a job uses (None = off) and the task-count bounds."""

    deferred_downscaling: DeferredDownscaling | None = field(default_factory=DeferredDownscaling)
    defer_small_changes: DeferSmallChanges | None = None
    limit_growth: LimitGrowth | None = None
    slow_decay: SlowDecay | None = field(default_factory=SlowDecay)
    min_tasks: int = 1
    max_tasks: int | None = None


class HorizontalReason(IntEnum):
    NONE = 0  # the stabilised recommendation is applied as is
    DEFERRED_DOWNSCALING = 1  # raw is lower, but a higher recommendation is still within T_d
    SMALL_CHANGE_IGNORED = 2
    GROWTH_LIMITED = 3
    SLOW_DECAY = 4

    @property
    def label(self) -> str:
        return self.name.lower().replace("_", " ")


@dataclass(frozen=True, eq=False)
class StabiliserState(JobArrays):
    deferred: WindowMaxState  # recent raw recommendations (unused if deferral is off)
    decay_start_tasks: Int64Array  # (J,): task count when the current slow decay began, -1 none
    decay_start_ms: Int64Array  # (J,)


def initial_stabiliser_state(jobs: int, config: StabiliserConfig) -> StabiliserState:
    slots = config.deferred_downscaling.slots if config.deferred_downscaling else 1
    return StabiliserState(
        initial_window_max(jobs, slots), np.full(jobs, -1, dtype=np.int64), np.zeros(jobs, dtype=np.int64)
    )


@dataclass(frozen=True, eq=False)
class HorizontalDecision:
    raw: FloatArray  # n_r[t]
    stabilised: FloatArray  # n_s[t] (after deferred downscaling and the bounds)
    target: Int64Array  # the task count to request now
    reason: Int8Array  # HorizontalReason per job


def stabilise(
    config: StabiliserConfig,
    state: StabiliserState,
    raw: npt.ArrayLike,
    current: npt.ArrayLike,
    time_ms: npt.ArrayLike,
    initialising: npt.ArrayLike | None = None,
) -> tuple[StabiliserState, HorizontalDecision]:
    """Turn raw recommendations n_r (J,) into task counts to request, given the current
    counts n (J,) and how many tasks are still initialising (J,)."""
    n_r = np.asarray(raw, dtype=np.float64)
    n = np.asarray(current, dtype=np.int64)
    t = np.asarray(time_ms, dtype=np.int64)
    init = np.zeros_like(n) if initialising is None else np.asarray(initialising, dtype=np.int64)
    jobs = state.decay_start_tasks.shape[0]
    if not n_r.shape == n.shape == t.shape == init.shape == (jobs,):
        raise ValueError(f"expected ({jobs},) arrays")
    if np.any(np.isnan(n_r)):
        raise ValueError("raw recommendations must not be NaN")
    reason = np.zeros(jobs, dtype=np.int8)

    # 1. Deferred downscaling.
    deferred_state = state.deferred
    if config.deferred_downscaling is not None:
        deferred_state, n_s = update_window_max(state.deferred, n_r, t, config.deferred_downscaling.slot_ms)
    else:
        n_s = n_r.copy()
    upper = np.inf if config.max_tasks is None else float(config.max_tasks)
    n_s = np.clip(np.ceil(n_s), config.min_tasks, upper)
    held_up = n_s > np.clip(n_r, config.min_tasks, upper)
    reason[held_up] = HorizontalReason.DEFERRED_DOWNSCALING
    goal = n_s.astype(np.int64)
    delta = goal - n
    target = goal.copy()

    # 2. Defer small changes.
    small = np.zeros(jobs, dtype=bool)
    if config.defer_small_changes is not None:
        rule = config.defer_small_changes
        threshold = np.maximum(rule.min_tasks, rule.min_fraction * n)
        small = (delta != 0) & (np.abs(delta) <= threshold)
        target[small] = n[small]
        reason[small] = HorizontalReason.SMALL_CHANGE_IGNORED

    # 3. Limiting growth.
    growing = (delta > 0) & ~small
    if config.limit_growth is not None:
        rule_g = config.limit_growth
        allowed = np.maximum(rule_g.min_initialising, np.floor(rule_g.max_initialising_fraction * n)).astype(
            np.int64
        )
        room = np.maximum(allowed - init, 0)
        capped = growing & (delta > room)
        target[capped] = n[capped] + room[capped]
        reason[capped] = HorizontalReason.GROWTH_LIMITED

    # 4. Slow decay.
    shrinking = (delta < 0) & ~small
    start_tasks = np.where(shrinking, state.decay_start_tasks, -1)
    start_ms = state.decay_start_ms.copy()
    if config.slow_decay is not None:
        rule_d = config.slow_decay
        begin = shrinking & (state.decay_start_tasks < 0)
        start_tasks[begin] = n[begin]
        start_ms[begin] = t[begin]
        steps = (t - start_ms) // rule_d.step_ms
        allowed_now = np.ceil(
            start_tasks * np.exp2(-(steps * rule_d.step_ms) / rule_d.halving_period_ms) - 1e-9
        )
        decayed = np.maximum(goal, np.minimum(n, allowed_now)).astype(np.int64)
        slowed = shrinking & (decayed > goal)
        target[shrinking] = decayed[shrinking]
        reason[slowed] = HorizontalReason.SLOW_DECAY
    new_state = StabiliserState(deferred_state, start_tasks.astype(np.int64), start_ms)
    return new_state, HorizontalDecision(n_r, n_s, target, reason)


@dataclass(frozen=True, eq=False)
class HorizontalState(JobArrays):
    source: CpuSourceState
    stabiliser: StabiliserState


@dataclass(frozen=True)
class CpuHorizontalRecommender:
    """The CPU-utilisation source followed by the stabilisers, as one restartable update."""

    source: CpuUtilisationSource
    stabiliser: StabiliserConfig = field(default_factory=StabiliserConfig)

    def initial_state(self, jobs: int = 1) -> HorizontalState:
        return HorizontalState(
            initial_cpu_source(jobs, self.source), initial_stabiliser_state(jobs, self.stabiliser)
        )

    def update(
        self,
        state: HorizontalState,
        total_usage: npt.ArrayLike,
        task_cpu_limit: npt.ArrayLike,
        current: npt.ArrayLike,
        time_ms: npt.ArrayLike,
        initialising: npt.ArrayLike | None = None,
    ) -> tuple[HorizontalState, HorizontalDecision]:
        """One usage sample per job (sum over its tasks) -> the task count to request now."""
        source_state, _, raw = update_cpu_source(
            self.source, state.source, total_usage, time_ms, task_cpu_limit
        )
        stabiliser_state, decision = stabilise(
            self.stabiliser, state.stabiliser, raw, current, time_ms, initialising
        )
        return HorizontalState(source_state, stabiliser_state), decision
