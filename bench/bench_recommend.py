"""Recommender throughput: batched updates of 10 000 jobs vs a plain per-job Python loop.

Both paths run the same maths on the same inputs in the same run (the loop's results are
checked against the batch's before anything is reported):

* moving window (§3.2.2): the recommender worker's candidates (decayed histogram, S_max
  ring, S_avg, load-adjusted S_pj, safety margin, max over the last hour per statistic),
  then the master's choice of statistic per job and its user bounds;
* ML ensemble (§3.2.3, eqs. 4-9): the default grid of 100 models (10 decay rates x 10
  margins) over the 400 CPU buckets.

The loop handles one job per call with numpy on that job's vectors (what a recommender
worker without batching would do); it is timed on a subset of the jobs and reported as a
rate, so the two rates compare directly. Figures are job-updates per second on one core.

For the ML ensemble the per-job loop already works on 10 x 400 arrays, so batching mostly
saves call overhead (``speedup_vs_loop``). A second baseline keeps eqs. 4-5 as literally
written, an overrun and an underrun curve per model (100 x 400 each), which is what the
per-decay-rate smoothed histograms of ``ml_ensemble`` avoid (``speedup_vs_literal_loop``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from bench.harness import FULL, SMOKE, Report, best_of, sized
from cellpilot.autopilot.candidates import (
    WINDOW_KINDS,
    WINDOW_STATISTICS,
    CandidateConfig,
    CandidateState,
    initial_candidate_state,
    update_candidates,
)
from cellpilot.autopilot.recommender_registry import BUILTIN_RECOMMENDERS
from cellpilot.autopilot.vertical_targets import bound_limits, chosen_values
from cellpilot.recommend.ml_ensemble import (
    EnsembleConfig,
    EnsembleState,
    initial_ensemble_state,
    update_ensemble,
)
from cellpilot.recommend.moving_window import WindowState
from cellpilot.recommend.policy import Statistic
from cellpilot.recommend.post_processing import EMPTY_SLOT, WindowMaxState
from cellpilot.usage.buckets import CPU_SCHEME, Resource

FIGURES = [
    "recommend.window.job_updates_per_s",
    "recommend.window.loop_job_updates_per_s",
    "recommend.window.speedup_vs_loop",
    "recommend.ml.job_updates_per_s",
    "recommend.ml.loop_job_updates_per_s",
    "recommend.ml.speedup_vs_loop",
    "recommend.ml.literal_loop_job_updates_per_s",
    "recommend.ml.speedup_vs_literal_loop",
    "recommend.ml.models",
    "recommend.ml.state_mb",
]


@dataclass(frozen=True)
class Size:
    jobs: int
    window_loop_jobs: int  # the per-job loops are timed on this many of the jobs
    ml_loop_jobs: int


SIZES = {
    FULL: Size(jobs=10_000, window_loop_jobs=1_000, ml_loop_jobs=300),
    SMOKE: Size(jobs=200, window_loop_jobs=50, ml_loop_jobs=100),
}
FIVE_MIN = 300_000
B = CPU_SCHEME.boundaries
FloatArray = npt.NDArray[np.float64]


def cpu_histograms(rng: np.random.Generator, levels: npt.NDArray[np.intp], steps: int) -> list[FloatArray]:
    """Per step a (jobs, K) matrix: 300 one-second samples per job spread around its level."""
    out = []
    for _ in range(steps):
        idx = np.clip(levels[:, None] + rng.integers(-12, 13, size=(levels.size, 300)), 0, B.size - 1)
        flat = (np.arange(levels.size)[:, None] * B.size + idx).ravel()
        out.append(
            np.bincount(flat, minlength=levels.size * B.size).reshape(levels.size, B.size).astype(float)
        )
    return out


# -- moving window: the plain per-job loop ----------------------------------------------


def window_loop_update(
    job: int,
    est: WindowState,
    hour: WindowMaxState,
    counts: FloatArray,
    t: int,
    statistic: int,
    upper: float,
) -> float:
    """One job's moving-window update, the same maths as the batched candidates, on this job's rows."""
    half_life, slot_ms = 12 * 3_600_000, FIVE_MIN
    factor = 2.0 ** (-(t - int(est.last_ms[job])) / half_life) if est.updates[job] > 0 else 0.0
    decayed = est.decayed[job] * factor + counts
    total = counts.sum()
    mean = (counts * B).sum() / total if total > 0 else 0.0
    weighted = est.avg_weighted_sum[job] * factor + mean
    weight = est.avg_weight[job] * factor + (1.0 if total > 0 else 0.0)
    ring = est.peak_ring[job].copy()
    nonzero = np.flatnonzero(counts)
    ring[int(est.updates[job]) % ring.size] = nonzero[-1] if nonzero.size else -1
    cum = np.cumsum(decayed * B)
    top = int(ring.max())
    stats = {
        Statistic.MAX: float(B[top]) if top >= 0 else math.nan,
        Statistic.AVG: weighted / weight if weight > 0 else math.nan,
    }
    for code, level in ((Statistic.P60, 60), (Statistic.P90, 90), (Statistic.P95, 95), (Statistic.P98, 98)):
        stats[code] = float(B[int(np.argmax(cum >= cum[-1] * level / 100 * (1 - 1e-9)))])
    if statistic == Statistic.MAX_OF_P60_AND_HALF_PEAK:
        raw = max(stats[Statistic.P60], 0.5 * stats[Statistic.MAX])
    else:
        raw = stats[Statistic(statistic)]
    # Safety margin: 15 % up to 1 core (1000 millicores), 10 % from 64 cores, log-linear between.
    position = min(max(math.log(max(raw, 1000.0) / 1000.0) / math.log(64.0), 0.0), 1.0)
    value = raw * (1.0 + 0.15 - 0.05 * position)
    # Max over the last hour in 5-minute slots.
    current = t // slot_ms
    slots, values = hour.slot_ids[job].copy(), hour.values[job].copy()
    i = current % slots.size
    values[i] = value if slots[i] != current else max(values[i], value)
    slots[i] = current
    held = max(v for s, v in zip(slots, values, strict=True) if s != EMPTY_SLOT and s > current - slots.size)
    return min(held, upper)


# -- ML ensemble: the plain per-job loop -----------------------------------------------


def ml_loop_update(job: int, state: EnsembleState, counts: FloatArray, config: EnsembleConfig) -> float:
    """One job's eqs. 4-9, the same maths as ``update_ensemble``, on this job's arrays."""
    grid = config.grid
    d = np.asarray(grid.distinct_decays)[:, None]
    dm, margins = grid.decay_index, np.asarray(grid.margins)
    w_o, w_u, w_dl, w_dm = config.w_overrun, config.w_underrun, config.w_limit_change, config.w_model_change
    s = counts / counts.sum()
    old = state.smoothed[job]
    h = old + d * (s - old)
    base = (w_u - w_o) * np.cumsum(h, axis=1) - w_u * h  # eqs. 4-5 less the constant w_o * T
    best = np.argmin(base, axis=1)
    best_cost = base[np.arange(best.size), best]
    prev = state.raw_limit[job].astype(np.intp)
    has_prev = prev >= 0
    stay_cost = base[dm, np.maximum(prev, 0)]
    move_to, move_cost = best[dm], best_cost[dm] + w_dl
    stay = has_prev & ((stay_cost < move_cost) | ((stay_cost == move_cost) & (prev < move_to)))
    new_raw = np.where(stay, prev, move_to)
    limits = B[new_raw] * (1.0 + margins)
    prev_limits = B[np.maximum(prev, 0)] * (1.0 + margins)
    at = np.where(has_prev, prev_limits, limits)
    cum_s = np.concatenate(([0.0], np.cumsum(s)))
    under_now = cum_s[np.searchsorted(B, at, side="left")]
    over_now = cum_s[-1] - cum_s[np.searchsorted(B, at, side="right")]
    changed = has_prev & (new_raw != prev)
    cost = config.cost_decay * (w_o * over_now + w_u * under_now + w_dl * changed)
    cost += (1.0 - config.cost_decay) * state.cost[job]
    prev_model = int(state.model[job])
    score = cost.copy()
    if prev_model >= 0:
        score += w_dm * (np.arange(grid.models) != prev_model)
        score += w_dl * (limits != prev_limits[prev_model])
    return float(limits[int(np.argmin(score))])


def ml_literal_costs(job: int, state: EnsembleState, config: EnsembleConfig) -> tuple[FloatArray, FloatArray]:
    """Eqs. 4-5 state as literally written: o(L) and u(L) per model and limit, (M, K) each."""
    h = state.smoothed[job][config.grid.decay_index]
    prefix = np.cumsum(h, axis=1)
    under = np.zeros_like(prefix)
    under[:, 1:] = prefix[:, :-1]
    return prefix[:, -1:] - prefix, under


def ml_literal_loop_update(
    job: int,
    state: EnsembleState,
    over: FloatArray,
    under: FloatArray,
    counts: FloatArray,
    config: EnsembleConfig,
) -> float:
    """One job's eqs. 4-9 keeping (M, K) overrun / underrun curves per model, as eqs. 4-5 read."""
    grid = config.grid
    d = np.asarray(grid.decay_rates)[:, None]
    margins = np.asarray(grid.margins)
    w_o, w_u, w_dl, w_dm = config.w_overrun, config.w_underrun, config.w_limit_change, config.w_model_change
    s = counts / counts.sum()
    cum_s = np.concatenate(([0.0], np.cumsum(s)))
    over = (1.0 - d) * over + d * (cum_s[-1] - cum_s[1:])  # eq. 4, every model and limit
    under = (1.0 - d) * under + d * cum_s[:-1]  # eq. 5
    prev = state.raw_limit[job].astype(np.intp)
    has_prev = prev >= 0
    penalised = (
        w_o * over + w_u * under + w_dl * (np.arange(B.size)[None, :] != prev[:, None]) * has_prev[:, None]
    )
    new_raw = np.argmin(penalised, axis=1)  # eq. 6
    limits = B[new_raw] * (1.0 + margins)  # eq. 7
    prev_limits = B[np.maximum(prev, 0)] * (1.0 + margins)
    at = np.where(has_prev, prev_limits, limits)
    under_now = cum_s[np.searchsorted(B, at, side="left")]
    over_now = cum_s[-1] - cum_s[np.searchsorted(B, at, side="right")]
    changed = has_prev & (new_raw != prev)
    cost = config.cost_decay * (w_o * over_now + w_u * under_now + w_dl * changed)  # eq. 8
    cost += (1.0 - config.cost_decay) * state.cost[job]
    prev_model = int(state.model[job])
    score = cost.copy()
    if prev_model >= 0:
        score += w_dm * (np.arange(grid.models) != prev_model)
        score += w_dl * (limits != prev_limits[prev_model])
    return float(limits[int(np.argmin(score))])  # eq. 9


# -- the benchmark ---------------------------------------------------------------------


def _check(batch: FloatArray, loop: list[float], what: str) -> None:
    if not np.allclose(batch, np.asarray(loop), rtol=1e-9, equal_nan=True):
        raise AssertionError(f"{what}: the per-job loop disagrees with the batched update")


def run(report: Report, size: str = FULL) -> None:
    params = sized(SIZES, size)
    rng = np.random.default_rng(20200427)
    levels = rng.integers(60, 340, size=params.jobs)
    histograms = cpu_histograms(rng, levels, steps=4)
    times = [np.full(params.jobs, (step + 1) * FIVE_MIN) for step in range(len(histograms))]
    _bench_window(report, params, rng, levels, histograms, times)
    _bench_ml(report, params, histograms, times)


def _bench_window(
    report: Report,
    size: Size,
    rng: np.random.Generator,
    levels: npt.NDArray[np.intp],
    histograms: list[FloatArray],
    times: list[npt.NDArray[np.int64]],
) -> None:
    """Moving window with mixed policies and user bounds across the jobs."""
    jobs, loop_jobs = size.jobs, size.window_loop_jobs
    config = CandidateConfig.for_resource(Resource.CPU)
    config = CandidateConfig(config.resource, config.scheme, config.window, config.margin, with_ml=False)
    column = rng.integers(0, len(WINDOW_KINDS), size=jobs)
    statistic = np.asarray([WINDOW_STATISTICS[BUILTIN_RECOMMENDERS[c]] for c in column], dtype=np.int8)
    upper = np.where(rng.random(jobs) < 0.2, B[levels], np.inf)
    state: CandidateState = initial_candidate_state(config, jobs)
    for step in range(3):  # warm up: a history to decay, a ring to fill
        state, _ = update_candidates(config, state, histograms[step], times[step])
    last, last_t = histograms[3], times[3]

    def batched() -> FloatArray:
        _, batch = update_candidates(config, state, last, last_t)
        chosen, _ = chosen_values(batch.value, batch.raised_by_window_max, column)
        return bound_limits(chosen, max_limit=upper)[0]

    seconds = best_of(3, batched)
    est, rings = state.window, state.hour_max

    def loop() -> list[float]:
        return [
            window_loop_update(
                j, est, rings[column[j]], last[j], int(last_t[j]), int(statistic[j]), float(upper[j])
            )
            for j in range(loop_jobs)
        ]

    loop_seconds = best_of(3, loop)
    _check(batched()[:loop_jobs], loop(), "moving window")
    rate, loop_rate = jobs / seconds, loop_jobs / loop_seconds
    report("recommend.window.job_updates_per_s", rate, "job-updates/s")
    report("recommend.window.loop_job_updates_per_s", loop_rate, "job-updates/s")
    report("recommend.window.speedup_vs_loop", rate / loop_rate, "x")


def _bench_ml(
    report: Report, size: Size, histograms: list[FloatArray], times: list[npt.NDArray[np.int64]]
) -> None:
    """ML ensemble with the default grid (100 models) over the 400 CPU buckets."""
    jobs, loop_jobs = size.jobs, size.ml_loop_jobs
    config = EnsembleConfig()
    state: EnsembleState = initial_ensemble_state(jobs, B.size, config)
    for step in range(3):
        state, _ = update_ensemble(config, B, state, histograms[step], times[step])
    last, last_t = histograms[3], times[3]
    seconds = best_of(3, lambda: update_ensemble(config, B, state, last, last_t))
    _, batch = update_ensemble(config, B, state, last, last_t)
    ens = state
    subset = range(loop_jobs)

    def loop() -> list[float]:
        return [ml_loop_update(j, ens, last[j], config) for j in subset]

    loop_seconds = best_of(3, loop)
    _check(batch.limit[:loop_jobs], loop(), "ML")
    rate, loop_rate = jobs / seconds, loop_jobs / loop_seconds
    report("recommend.ml.job_updates_per_s", rate, "job-updates/s")
    report("recommend.ml.loop_job_updates_per_s", loop_rate, "job-updates/s")
    report("recommend.ml.speedup_vs_loop", rate / loop_rate, "x")

    # The literal formulation: per-model (M, K) cost curves instead of per-decay histograms.
    curves = [ml_literal_costs(j, ens, config) for j in subset]

    def literal_loop() -> list[float]:
        return [ml_literal_loop_update(j, ens, *curves[j], last[j], config) for j in subset]

    literal_seconds = best_of(3, literal_loop)
    # Sums in a different order may break an exact tie differently in a rare job.
    agree = np.isclose(np.asarray(literal_loop()), batch.limit[:loop_jobs], rtol=1e-9)
    if agree.mean() < 0.99:
        raise AssertionError("ML: the literal per-model loop disagrees with the batched update")
    literal_rate = loop_jobs / literal_seconds
    report("recommend.ml.literal_loop_job_updates_per_s", literal_rate, "job-updates/s")
    report("recommend.ml.speedup_vs_literal_loop", rate / literal_rate, "x")
    report("recommend.ml.models", config.grid.models, "models")
    report("recommend.ml.state_mb", state.nbytes / 2**20, "MB")
