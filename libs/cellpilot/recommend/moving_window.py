"""Moving-window statistics of Autopilot §3.2.2: S_max, S_avg (eq. 2) and S_pj (eq. 3).

Incremental form. Eq. 1 weighs a sample of age tau by w[tau] = 2^(-tau / t_half). When a
new histogram arrives dt ms after the previous one, every older weight is multiplied by
2^(-dt / t_half) and the new sample enters with weight 1, so each sum over the whole
history (eq. 2's numerator and denominator, eq. 3's decayed histogram) is kept as one
running value per job: O(buckets) per update, never a rescan. Ages are measured in event
time (the histograms' timestamps), so gaps in the signal decay correctly.

S_max needs the last N samples exactly, so each job keeps a ring of the highest non-empty
bucket of each of its last N histograms (O(N) per update, N a small constant).

Everything works on stacked jobs: ``counts`` is (J, K), one histogram per job, and
statistics come back as (J,) arrays; one job is J = 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cellpilot.array_types import FloatArray, Int32Array, Int64Array
from cellpilot.recommend.job_arrays import JobArrays, step_inputs
from cellpilot.usage.buckets import Resource

HOUR_MS = 3600 * 1000
# §3.2.2: "a 12 hour half life for the CPU signal and a 48 hour half life for memory".
CPU_HALF_LIFE_MS = 12 * HOUR_MS
MEMORY_HALF_LIFE_MS = 48 * HOUR_MS
# §3.2.2 calls N (the S_max horizon) "a fixed system parameter" without a value; one day of
# 5-minute windows is our default.
DEFAULT_PEAK_SAMPLES = 288
# The percentiles the §3.2.2 policy table uses: p60 (memory, intermediate OOM tolerance),
# p90 / p95 (CPU serving), p98 (memory, low OOM tolerance).
DEFAULT_PERCENTILES: tuple[float, ...] = (60.0, 90.0, 95.0, 98.0)
# A percentile is the first bucket whose cumulative weight reaches the level; the tiny
# relative slack makes a cumulative weight that equals the threshold in exact arithmetic
# count as reaching it whatever the summation order (incremental vs from-scratch).
_PERCENTILE_RTOL = 1e-9
DEFAULT_CHUNK_JOBS = 512


@dataclass(frozen=True)
class WindowConfig:
    half_life_ms: int
    peak_samples: int = DEFAULT_PEAK_SAMPLES
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES

    def __post_init__(self) -> None:
        if self.half_life_ms <= 0 or self.peak_samples <= 0:
            raise ValueError("half_life_ms and peak_samples must be positive")
        if any(not 0.0 < p <= 100.0 for p in self.percentiles):
            raise ValueError("percentiles must be in (0, 100]")

    @classmethod
    def for_resource(cls, resource: Resource) -> WindowConfig:
        return cls(CPU_HALF_LIFE_MS if resource is Resource.CPU else MEMORY_HALF_LIFE_MS)


def decay_weight(age_ms: npt.ArrayLike, half_life_ms: float) -> FloatArray:
    """Eq. 1: w[tau] = 2^(-tau / t_half)."""
    return np.asarray(np.exp2(-np.asarray(age_ms, dtype=np.float64) / float(half_life_ms)), dtype=np.float64)


@dataclass(frozen=True, eq=False)
class WindowState(JobArrays):
    """Per-job running sums; every array has the job axis first."""

    decayed: FloatArray  # (J, K): sum_tau w[tau] s[t - tau][k], eq. 3 before the b[k] factor
    avg_weighted_sum: FloatArray  # (J,): eq. 2 numerator, sum_tau w[tau] mean(s[t - tau])
    avg_weight: FloatArray  # (J,): eq. 2 denominator, sum of the weights of non-empty samples
    peak_ring: Int32Array  # (J, N): highest non-empty bucket of each of the last N samples, -1 none
    updates: Int64Array  # (J,): histograms seen
    last_ms: Int64Array  # (J,): event time of the latest histogram


def initial_window_state(jobs: int, buckets: int, config: WindowConfig) -> WindowState:
    return WindowState(
        decayed=np.zeros((jobs, buckets)),
        avg_weighted_sum=np.zeros(jobs),
        avg_weight=np.zeros(jobs),
        peak_ring=np.full((jobs, config.peak_samples), -1, dtype=np.int32),
        updates=np.zeros(jobs, dtype=np.int64),
        last_ms=np.zeros(jobs, dtype=np.int64),
    )


@dataclass(frozen=True, eq=False)
class WindowStatistics:
    """S_max, S_avg and S_pj for every job (NaN where a job has no usage yet)."""

    levels: tuple[float, ...]
    s_max: FloatArray  # (J,)
    s_avg: FloatArray  # (J,)
    s_percentiles: FloatArray  # (J, P), column p is S_p{levels[p]}

    def percentile(self, level: float) -> FloatArray:
        try:
            column = self.levels.index(float(level))
        except ValueError:
            raise KeyError(f"percentile {level} not computed; configured: {self.levels}") from None
        return self.s_percentiles[:, column]

    def as_dict(self) -> dict[str, FloatArray]:
        out = {"max": self.s_max, "avg": self.s_avg}
        for i, level in enumerate(self.levels):
            out[f"p{level:g}"] = self.s_percentiles[:, i]
        return out


def weighted_percentile(boundaries: FloatArray, weights: npt.ArrayLike, level: float) -> FloatArray:
    """P_level of a histogram: the smallest b[k] whose cumulative weight reaches level % of the total.

    ``weights`` is (..., K); the result is (...), NaN where the total weight is 0. With
    count weights this is the percentile "by time" of Figure 2; with load-adjusted weights
    b[k] * count it is S_pj.
    """
    w = np.asarray(weights, dtype=np.float64)
    cum = np.cumsum(w, axis=-1)
    return _percentiles_from_cumsum(boundaries, cum, (float(level),))[..., 0]


def _percentiles_from_cumsum(
    boundaries: FloatArray, cum: FloatArray, levels: tuple[float, ...]
) -> FloatArray:
    total = cum[..., -1]
    out = np.full((*total.shape, len(levels)), np.nan)
    has = total > 0.0
    for i, level in enumerate(levels):
        threshold = total * (level / 100.0) * (1.0 - _PERCENTILE_RTOL)
        index = np.argmax(cum >= threshold[..., None], axis=-1)
        out[..., i] = np.where(has, boundaries[index], np.nan)
    return out


def _statistics_chunk(
    config: WindowConfig,
    boundaries: FloatArray,
    decayed: FloatArray,
    avg_weighted_sum: FloatArray,
    avg_weight: FloatArray,
    peak_ring: Int32Array,
) -> tuple[FloatArray, FloatArray, FloatArray]:
    # Eq. 3: h[t][k] = b[k] * sum_tau w[tau] s[t - tau][k]; S_pj = P_j(h[t]).
    cum = np.cumsum(decayed * boundaries, axis=1)
    s_pct = _percentiles_from_cumsum(boundaries, cum, config.percentiles)
    # Eq. 2 (see update_window for the denominator).
    with np.errstate(invalid="ignore", divide="ignore"):
        s_avg = np.where(avg_weight > 0.0, avg_weighted_sum / avg_weight, np.nan)
    # S_max: b[j] of the highest non-empty bucket across the last N samples.
    top = peak_ring.max(axis=1)
    s_max = np.where(top >= 0, boundaries[np.maximum(top, 0)], np.nan)
    return s_max, s_avg, s_pct


def highest_nonempty(counts: FloatArray) -> Int32Array:
    """Index of the highest bucket with a positive count in each row, -1 for empty rows."""
    positive = counts > 0.0
    last = counts.shape[1] - 1 - np.argmax(positive[:, ::-1], axis=1)
    return np.where(positive.any(axis=1), last, -1).astype(np.int32)


def update_window(
    config: WindowConfig,
    boundaries: FloatArray,
    state: WindowState,
    counts: npt.ArrayLike,
    time_ms: npt.ArrayLike,
    *,
    chunk_jobs: int = DEFAULT_CHUNK_JOBS,
) -> tuple[WindowState, WindowStatistics]:
    """Fold one new histogram per job (``counts`` (J, K) at event times ``time_ms`` (J,)).

    Returns the new state (the old one is not modified) and S_max / S_avg / S_pj.
    """
    jobs, buckets = state.decayed.shape
    s, t = step_inputs(counts, time_ms, buckets, state.updates, state.last_ms)
    seen = state.updates > 0
    # Eq. 1 applied incrementally: all older samples age by dt.
    factor = np.where(seen, decay_weight(t - state.last_ms, config.half_life_ms), 0.0)

    decayed = np.empty_like(state.decayed)
    peak_ring = state.peak_ring.copy()
    slot = (state.updates % config.peak_samples).astype(np.intp)
    totals = s.sum(axis=1)
    nonempty = totals > 0.0
    sample_means = np.zeros(jobs)
    s_max = np.empty(jobs)
    s_avg = np.empty(jobs)
    s_pct = np.empty((jobs, len(config.percentiles)))
    # Eq. 2 as a proper weighted mean: the numerator sums w[tau] * mean(s[t - tau]) over the
    # non-empty samples and the denominator sums the same weights. (The paper's denominator
    # runs to N while the numerator runs to infinity; dividing by the weights actually used
    # keeps S_avg unbiased for short histories and equals the paper's once N covers them.)
    for lo in range(0, jobs, chunk_jobs):
        hi = min(lo + chunk_jobs, jobs)
        chunk = slice(lo, hi)
        np.multiply(state.decayed[chunk], factor[chunk, None], out=decayed[chunk])
        decayed[chunk] += s[chunk]
        # Row-wise sums (not a matrix product) so a job's result does not depend on the batch.
        sample_means[chunk] = np.divide(
            (s[chunk] * boundaries).sum(axis=1), totals[chunk], out=np.zeros(hi - lo), where=nonempty[chunk]
        )
        peak_ring[np.arange(lo, hi), slot[chunk]] = highest_nonempty(s[chunk])
    avg_weighted_sum = state.avg_weighted_sum * factor + sample_means
    avg_weight = state.avg_weight * factor + nonempty
    for lo in range(0, jobs, chunk_jobs):
        chunk = slice(lo, min(lo + chunk_jobs, jobs))
        s_max[chunk], s_avg[chunk], s_pct[chunk] = _statistics_chunk(
            config, boundaries, decayed[chunk], avg_weighted_sum[chunk], avg_weight[chunk], peak_ring[chunk]
        )
    new_state = WindowState(
        decayed=decayed,
        avg_weighted_sum=avg_weighted_sum,
        avg_weight=avg_weight,
        peak_ring=peak_ring,
        updates=state.updates + 1,
        last_ms=t.copy(),
    )
    return new_state, WindowStatistics(config.percentiles, s_max, s_avg, s_pct)


def statistics_from_history(
    config: WindowConfig, boundaries: FloatArray, counts: npt.ArrayLike, time_ms: npt.ArrayLike
) -> WindowStatistics:
    """From-scratch statistics of one job's whole history (``counts`` (T, K), times (T,)).

    The reference the incremental path must agree with, and the convenient form for an
    offline replay that holds a job's history anyway. Returns J = 1 statistics.
    """
    s = np.asarray(counts, dtype=np.float64)
    t = np.asarray(time_ms, dtype=np.int64)
    if s.ndim != 2 or t.shape != (s.shape[0],) or s.shape[0] == 0:
        raise ValueError("need a non-empty (T, K) history with one time per histogram")
    if np.any(np.diff(t) < 0):
        raise ValueError("history must be in event-time order")
    weights = decay_weight(t[-1] - t, config.half_life_ms)
    totals = s.sum(axis=1)
    nonempty = totals > 0.0
    means = np.divide((s * boundaries).sum(axis=1), totals, out=np.zeros_like(totals), where=nonempty)
    ring = highest_nonempty(s[-config.peak_samples :])
    s_max, s_avg, s_pct = _statistics_chunk(
        config,
        boundaries,
        (weights @ s)[None, :],
        np.array([np.sum(weights * means)]),
        np.array([np.sum(weights * nonempty)]),
        ring[None, :],
    )
    return WindowStatistics(config.percentiles, s_max, s_avg, s_pct)
