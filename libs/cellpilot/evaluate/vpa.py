"""The Kubernetes Vertical Pod Autoscaler's recommender and updater, rewritten from their documentation.

A baseline for Autopilot §4 (the paper's [15] is VPA's design proposal: "Kubernetes' approach
was directly inspired by our moving window recommenders", §7). Written from VPA's
documented behaviour, not from its code:

* ``vertical-pod-autoscaler/docs/flags.md`` (kubernetes/autoscaler): the defaults used
  here — ``cpu-histogram-decay-half-life`` and ``memory-histogram-decay-half-life`` 24 h,
  ``memory-aggregation-interval`` 24 h ("one memory usage sample per interval (the maximum
  usage over that interval)"), ``target-cpu-percentile`` / ``target-memory-percentile``
  0.9, ``recommendation-lower-bound-*-percentile`` 0.5, ``recommendation-upper-bound-*-
  percentile`` 0.95, ``recommendation-margin-fraction`` 0.15, ``oom-bump-up-ratio`` 1.2,
  ``oom-min-bump-up-bytes`` 100 MiB, ``pod-recommendation-min-cpu-millicores`` 25,
  ``pod-recommendation-min-memory-mb`` 250; the updater's ``pod-update-threshold`` 0.1,
  ``in-recommendation-bounds-eviction-lifetime-threshold`` 12 h and
  ``evict-after-oom-threshold`` 10 min;
* the VPA design proposal (kubernetes/community, design-proposals/autoscaling/
  vertical-pod-autoscaler.md): the recommendation sets the *request*; OOMs become
  artificial memory samples above the last observed usage; the updater acts when the
  recommendation "significantly diverges" from the configured resources;
* the OpenShift VPA documentation ("custom memory bump-up after OOM events"): the
  recommendation after an OOM is max(usage at the OOM + oom-min-bump-up-bytes, usage at the
  OOM x oom-bump-up-ratio);
* public write-ups of the algorithm (e.g. "K8s Vertical Pod Autoscaler's Algorithm",
  T. Tanay, 2024): histograms with exponentially growing buckets (first bucket 0.01 cores /
  1e7 bytes, each 5 % larger, up to 1000 cores / 1e12 bytes); a sample's weight grows as
  2^((t - t_ref) / half-life), so older samples count half as much per half-life; every CPU
  sample carries the same constant weight, 0.1 (VPA 1.4 dropped the weighting by the
  container's CPU request: the recommender's minSampleWeight for every sample); a percentile is the
  end of the bucket where the cumulative weight reaches it; bounds scaled by the
  confidence multiplier (1 + multiplier / confidence)^exponent with confidence =
  min(days between the first and last sample, samples / (60 x 24)), (1.0, +1.0) for the
  upper bound and (0.001, -2.0) for the lower; minimum resources applied last.

Edge behaviour, as the Kubernetes VPA recommender documents and its design describes it:

* a histogram's percentile is 0 while it is empty, and the scan for a percentile runs from
  its first non-empty bucket to its last, so a level <= 0 gives the first non-empty bucket
  and a level >= 1 the last (a subtraction that leaves only rounding residue empties a bucket);
* a usage sample must be valid: negative (or missing) CPU and memory usage is discarded, and
  a container's CPU sample must start after its previous one (a duplicate or out-of-order CPU
  sample is discarded);
* an OOM event older than the container's current memory aggregation interval (its window
  end minus memory-aggregation-interval) is too old and is ignored.

What this model takes as given (documented choices): one VPA per job, all its tasks
aggregated as containers of one controller; a sample per task and 5-minute window (the
metrics server samples every minute, so a window counts as 5 samples for confidence);
resizes are applied to all tasks at once (in-place, ignoring the updater's eviction rate
limits and its two-replica minimum); the "usage at the OOM" is max(request, the task's
peak in the current interval), the recent non-OOM peak VPA records.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cellpilot.units import MIB

FloatArray = npt.NDArray[np.float64]
Int64Array = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
IntpArray = npt.NDArray[np.intp]

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
_MAX_EXPONENT = 50.0  # re-base the decay reference before weights grow past 2**50
# A bucket left by a subtraction with at most this fraction of the subtracted weight is empty
# (the Kubernetes VPA recommender's histogram treats a bucket below a tiny epsilon as empty).
_RESIDUE = 1e-9
_NEVER_MS = np.iinfo(np.int64).min


@dataclass(frozen=True)
class VpaHistogramOptions:
    """Exponential buckets: bucket k starts at first * (ratio^k - 1) / (ratio - 1)."""

    first_bucket: float
    max_value: float
    ratio: float = 1.05

    @property
    def buckets(self) -> int:
        """Enough buckets that ``max_value`` falls inside one; the last is open-ended."""
        return (
            math.ceil(math.log(self.max_value * (self.ratio - 1.0) / self.first_bucket + 1.0, self.ratio)) + 1
        )

    def bucket_start(self, k: npt.ArrayLike) -> FloatArray:
        k_arr = np.asarray(k, dtype=np.float64)
        return np.asarray(
            self.first_bucket * (self.ratio**k_arr - 1.0) / (self.ratio - 1.0), dtype=np.float64
        )

    def bucket_of(self, values: npt.ArrayLike) -> IntpArray:
        v = np.maximum(np.asarray(values, dtype=np.float64), 0.0)
        k = np.floor(np.log1p(v * (self.ratio - 1.0) / self.first_bucket) / math.log(self.ratio))
        k = np.clip(k, 0, self.buckets - 1).astype(np.intp)
        # Guard the floating-point edges: a value equal to a bucket start belongs to that bucket.
        k = np.where((k > 0) & (self.bucket_start(k) > v), k - 1, k)
        up = (k < self.buckets - 1) & (self.bucket_start(k + 1) <= v)
        return np.asarray(np.where(up, k + 1, k), dtype=np.intp)

    def percentile_value(self, bucket: IntpArray) -> FloatArray:
        """The value a percentile in ``bucket`` reports: the bucket's end, or the last bucket's start."""
        last = bucket >= self.buckets - 1
        return np.where(last, self.bucket_start(bucket), self.bucket_start(bucket + 1))


MEMORY_HISTOGRAM = VpaHistogramOptions(first_bucket=1e7, max_value=1e12)
# CPU in millicores (cellpilot.units): 0.01 cores .. 1000 cores.
CPU_HISTOGRAM = VpaHistogramOptions(first_bucket=10.0, max_value=1_000_000.0)


@dataclass(frozen=True)
class VpaConfig:
    """VPA's documented defaults (see the module docstring)."""

    half_life_ms: int = DAY_MS
    memory_aggregation_ms: int = DAY_MS
    target_percentile: float = 0.9
    lower_percentile: float = 0.5
    upper_percentile: float = 0.95
    margin: float = 0.15
    upper_confidence: tuple[float, float] = (1.0, 1.0)  # (multiplier, exponent)
    lower_confidence: tuple[float, float] = (0.001, -2.0)
    oom_bump_ratio: float = 1.2
    oom_min_bump_bytes: float = 100 * MIB
    min_memory_bytes: float = 250 * MIB
    min_cpu_millicores: float = 25.0
    cpu_sample_weight: float = 0.1  # constant since VPA 1.4 (no longer the CPU request)
    samples_per_window: float = 5.0  # one metrics-server sample per minute
    update_threshold: float = 0.1
    in_bounds_lifetime_ms: int = 12 * HOUR_MS
    evict_after_oom_ms: int = 10 * 60_000


@dataclass(eq=False)
class VpaState:
    """Per job a decaying histogram; per task (container) its memory interval and peaks.

    Mutable: the replay owns one state per study chunk and updates it in place every window
    (copying a (jobs, buckets) array per window would dominate the cost).
    """

    weights: FloatArray  # (J, B)
    reference_ms: Int64Array  # (J,)
    samples: FloatArray  # (J,) sample count behind the confidence
    first_ms: Int64Array  # (J,) -1 before any sample
    last_ms: Int64Array  # (J,)
    interval_end_ms: Int64Array  # (N,) -1 before the task's first memory sample
    usage_peak: FloatArray  # (N,) the task's non-OOM peak in its current interval
    oom_peak: FloatArray  # (N,) the task's OOM sample in its current interval
    last_cpu_ms: Int64Array  # (N,) the start of the task's last accepted CPU sample


@dataclass(frozen=True, eq=False)
class VpaEstimate:
    """Per job: the target, lower and upper bound of the recommendation (NaN without samples)."""

    target: FloatArray
    lower: FloatArray
    upper: FloatArray


@dataclass(frozen=True)
class VpaRecommender:
    """VPA's recommender for one resource ("memory" or "cpu"), vectorised over jobs and tasks."""

    resource: str = "memory"
    config: VpaConfig = VpaConfig()

    def __post_init__(self) -> None:
        if self.resource not in ("memory", "cpu"):
            raise ValueError("resource must be 'memory' or 'cpu'")

    @property
    def options(self) -> VpaHistogramOptions:
        return MEMORY_HISTOGRAM if self.resource == "memory" else CPU_HISTOGRAM

    @property
    def minimum(self) -> float:
        return self.config.min_memory_bytes if self.resource == "memory" else self.config.min_cpu_millicores

    def initial_state(self, jobs: int, tasks: int) -> VpaState:
        return VpaState(
            weights=np.zeros((jobs, self.options.buckets)),
            reference_ms=np.zeros(jobs, dtype=np.int64),
            samples=np.zeros(jobs),
            first_ms=np.full(jobs, -1, dtype=np.int64),
            last_ms=np.full(jobs, -1, dtype=np.int64),
            interval_end_ms=np.full(tasks, -1, dtype=np.int64),
            usage_peak=np.zeros(tasks),
            oom_peak=np.zeros(tasks),
            last_cpu_ms=np.full(tasks, _NEVER_MS, dtype=np.int64),
        )

    # -- the decaying histogram ------------------------------------------------------------

    def _add(
        self, state: VpaState, jobs: IntpArray, values: FloatArray, weights: FloatArray, time_ms: Int64Array
    ) -> None:
        """AddSample / SubtractSample (negative weight): weight x 2^((t - ref) / half-life)."""
        if jobs.size == 0:
            return
        half = self.config.half_life_ms
        far = (time_ms - state.reference_ms[jobs]) / half > _MAX_EXPONENT
        if far.any():  # re-base: scale the job's weights down, move its reference forward
            for job in np.unique(jobs[far]):
                new_ref = int(time_ms[jobs == job].max())
                state.weights[job] *= 2.0 ** (-(new_ref - int(state.reference_ms[job])) / half)
                state.reference_ms[job] = new_ref
        decay = np.exp2((time_ms - state.reference_ms[jobs]) / half)
        buckets = self.options.bucket_of(values)
        np.add.at(state.weights, (jobs, buckets), weights * decay)
        removed = weights < 0.0
        if removed.any():  # SubtractSample: what is left of a bucket at rounding level is empty
            rows, cols = jobs[removed], buckets[removed]
            residue = state.weights[rows, cols] <= _RESIDUE * (-weights[removed] * decay[removed])
            state.weights[rows[residue], cols[residue]] = 0.0

    def _count(self, state: VpaState, jobs: IntpArray, samples: FloatArray, time_ms: int) -> None:
        np.add.at(state.samples, jobs, samples)
        seen = np.unique(jobs)
        state.first_ms[seen] = np.where(state.first_ms[seen] < 0, time_ms, state.first_ms[seen])
        state.last_ms[seen] = time_ms

    # -- memory: one peak per task and aggregation interval ---------------------------------

    def add_memory_samples(
        self,
        state: VpaState,
        job_of_task: IntpArray,
        tasks: IntpArray,
        usage: FloatArray,
        time_ms: int,
        *,
        oom: bool = False,
    ) -> None:
        """A memory sample of each listed task at ``time_ms`` (in place).

        In its current interval (24 h) a task contributes one sample, its peak, stamped at
        the interval's end: a higher value replaces it (the old one is subtracted); a sample
        past the interval's end opens the next interval that holds it and starts a new peak.
        A negative (or NaN) usage is an invalid sample and is discarded.
        """
        valid = usage >= 0.0
        if not valid.all():
            tasks, usage = tasks[valid], usage[valid]
        if tasks.size == 0:
            return
        t = np.int64(time_ms)
        end = state.interval_end_ms[tasks]
        end = np.where(end < 0, t, end)  # the first sample opens an interval ending now...
        jobs = job_of_task[tasks]
        peak_now = np.maximum(state.usage_peak[tasks], state.oom_peak[tasks])
        inside = t < end  # ...so it is "past the end" and shifts to [t, t + interval)
        replace = inside & (peak_now > 0.0) & (usage > peak_now)
        self._add(state, jobs[replace], peak_now[replace], -np.ones(int(replace.sum())), end[replace])
        shift = ~inside
        interval = self.config.memory_aggregation_ms
        new_end = np.where(shift, end + ((t - end) // interval + 1) * interval, end)
        add = replace | shift
        self._add(state, jobs[add], usage[add], np.ones(int(add.sum())), new_end[add])
        state.interval_end_ms[tasks] = new_end
        usage_peak = np.where(shift, 0.0, state.usage_peak[tasks])
        oom_peak = np.where(shift, 0.0, state.oom_peak[tasks])
        if oom:
            oom_peak = np.where(add, usage, oom_peak)
        else:
            usage_peak = np.where(add, usage, usage_peak)
            self._count(state, jobs, np.full(tasks.size, self.config.samples_per_window), time_ms)
        state.usage_peak[tasks] = usage_peak
        state.oom_peak[tasks] = oom_peak

    def record_ooms(
        self,
        state: VpaState,
        job_of_task: IntpArray,
        tasks: IntpArray,
        request: FloatArray,
        time_ms: int,
    ) -> None:
        """OOM events of the listed tasks (``request`` per task): bump-up samples (in place).

        Memory at the OOM = max(the request, the task's recent non-OOM peak); the sample is
        max(that + oom-min-bump-up-bytes, that x oom-bump-up-ratio). An OOM older than the
        start of the task's current memory aggregation interval is ignored (the Kubernetes VPA
        recommender discards such an OOM as too old); before the task's first memory sample
        every OOM counts.
        """
        end = state.interval_end_ms[tasks]
        recent = (end < 0) | (np.int64(time_ms) >= end - self.config.memory_aggregation_ms)
        if not recent.all():
            tasks, request = tasks[recent], request[recent]
        if tasks.size == 0:
            return
        used = np.maximum(request, state.usage_peak[tasks])
        needed = np.maximum(used + self.config.oom_min_bump_bytes, used * self.config.oom_bump_ratio)
        self.add_memory_samples(state, job_of_task, tasks, needed, time_ms, oom=True)

    # -- CPU: every sample, one constant weight -----------------------------------------------

    def add_cpu_samples(
        self,
        state: VpaState,
        job_of_task: IntpArray,
        tasks: IntpArray,
        values: FloatArray,
        fractions: FloatArray,
        time_ms: int,
    ) -> None:
        """CPU usage points of the task-windows starting at ``time_ms`` (in place).

        ``tasks`` names each point's task. Each point stands for ``fractions`` of a window's
        samples (the fractions of one task-window sum to 1); every sample weighs
        ``cpu_sample_weight`` (0.1, as VPA 1.4+). As the Kubernetes VPA recommender does, a
        task's CPU sample that does not start after its previous accepted one (out of time
        order, or a duplicate) is discarded, and so is a negative (or NaN) usage point.
        """
        t = np.int64(time_ms)
        keep = (values >= 0.0) & (t > state.last_cpu_ms[tasks])
        if not keep.all():
            tasks, values, fractions = tasks[keep], values[keep], fractions[keep]
        if tasks.size == 0:
            return
        state.last_cpu_ms[tasks] = t
        jobs = job_of_task[tasks]
        weight = fractions * self.config.samples_per_window * self.config.cpu_sample_weight
        self._add(state, jobs, values, weight, np.full(jobs.size, t, dtype=np.int64))
        self._count(state, jobs, fractions * self.config.samples_per_window, time_ms)

    # -- estimation ---------------------------------------------------------------------------

    def percentile(self, state: VpaState, level: float) -> FloatArray:
        """Per job: the end of the bucket where the cumulative weight reaches ``level``.

        As the Kubernetes VPA recommender's histogram: 0 for an empty histogram; the scan
        starts at the first non-empty bucket and stops at the last one, so ``level <= 0``
        gives the first non-empty bucket and ``level >= 1`` the last.
        """
        return self._percentiles(state, (level,))[0]

    def _percentiles(self, state: VpaState, levels: tuple[float, ...]) -> list[FloatArray]:
        weights = state.weights
        occupied = weights > 0.0
        first = np.argmax(occupied, axis=1)
        last = weights.shape[1] - 1 - np.argmax(occupied[:, ::-1], axis=1)
        nonempty = occupied[np.arange(weights.shape[0]), first]
        cum = np.cumsum(weights, axis=1)
        out = []
        for level in levels:
            reached = cum >= (level * cum[:, -1])[:, None]
            bucket = np.where(reached.any(axis=1), np.argmax(reached, axis=1), last)
            bucket = np.clip(bucket, first, last).astype(np.intp)
            out.append(np.where(nonempty, self.options.percentile_value(bucket), 0.0))
        return out

    def confidence(self, state: VpaState) -> FloatArray:
        lifespan = np.where(state.first_ms >= 0, (state.last_ms - state.first_ms) / DAY_MS, 0.0)
        return np.asarray(np.minimum(lifespan, state.samples / (60.0 * 24.0)), dtype=np.float64)

    def estimate(self, state: VpaState) -> VpaEstimate:
        """Per job target and bounds; NaN for a job whose histogram is empty (no recommendation)."""
        c = self.config
        confidence = self.confidence(state)
        with np.errstate(divide="ignore", invalid="ignore"):
            up_mult = (1.0 + c.upper_confidence[0] / confidence) ** c.upper_confidence[1]
            low_mult = (1.0 + c.lower_confidence[0] / confidence) ** c.lower_confidence[1]
        margin = 1.0 + c.margin
        levels = (c.target_percentile, c.lower_percentile, c.upper_percentile)
        p_target, p_lower, p_upper = self._percentiles(state, levels)
        empty = ~(state.weights > 0.0).any(axis=1)
        with np.errstate(invalid="ignore"):  # an empty histogram: 0 x an infinite multiplier
            target = np.where(empty, np.nan, p_target * margin)
            lower = np.where(empty, np.nan, p_lower * margin * low_mult)
            upper = np.where(empty, np.nan, p_upper * margin * up_mult)
        return VpaEstimate(
            target=np.where(np.isnan(target), np.nan, np.maximum(target, self.minimum)),
            lower=np.where(np.isnan(lower), np.nan, np.maximum(lower, self.minimum)),
            upper=np.where(np.isnan(upper), np.nan, np.maximum(upper, self.minimum)),
        )


def updater_decision(
    config: VpaConfig,
    current: FloatArray,
    estimate: VpaEstimate,
    since_update_ms: Int64Array,
    quick_oom: BoolArray,
) -> BoolArray:
    """Which jobs VPA's updater resizes now (to ``estimate.target``).

    Outside [lower, upper] always; after a quick OOM (within evict-after-oom-threshold of a
    task's start) always; otherwise only once the pods have lived 12 h and the relative
    change is at least pod-update-threshold (0.1).
    """
    has = ~np.isnan(estimate.target)
    with np.errstate(divide="ignore", invalid="ignore"):
        change = np.abs(estimate.target - current) / current
    outside = (current < estimate.lower) | (current > estimate.upper)
    settled = (since_update_ms >= config.in_bounds_lifetime_ms) & (change >= config.update_threshold)
    differs = estimate.target != current
    return np.asarray(has & differs & (outside | quick_oom | settled), dtype=bool)
