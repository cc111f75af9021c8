"""A seeded population of long-running jobs for replaying Autopilot's vertical recommenders (§4).

Every job is drawn from its own generator ``default_rng([seed, job])``, so job ``j`` is the
same whatever else is generated and in whatever order or process. The population follows
what the papers say about Borg workloads, with the numbers the papers leave open chosen as
plain priors (listed in :class:`AutopilotWorkloadConfig`, never fitted to Autopilot's
results):

* **Jobs of 1 to thousands of tasks** (Borg §2.1: "a median cluster ... runs many kinds of
  workloads"; Autopilot §2.1: tasks of a job are interchangeable replicas): most jobs are
  small, a few have thousands of tasks; replicas differ by a persistent per-task factor.
* **Serving jobs** (Autopilot §2.1: "end-user serving jobs have diurnal or weekly load
  patterns"): a daily cosine at a per-job peak hour, a weekend dip, organic growth or
  decline compounding per day (§1: "traffic changes across longer time scales"), load
  spikes held for minutes to an hour, per-window noise (CPU much noisier than memory),
  5-minute peaks above the 5-minute averages.
* **Binary roll-outs** (§2.1, §1: "the resources needed ... vary with new features,
  optimizations and updates"): at Poisson times the job's usage steps by a random factor;
  tasks switch one by one over a few hours, restarting as they do.
* **Slow memory leaks** (§4.1 footnote 2, Figure 9b): a fraction of serving jobs grow by a
  fraction of their size per day of a task's uptime; a restart (roll-out or OOM) resets it.
* **Batch jobs** (Borg §2.1): task slots run back-to-back task instances of a few hours
  whose memory ramps to an instance-specific peak and holds.
* **OOM tolerance classes** (Autopilot §3.2.2): "minimal" for small jobs and "low" for
  large ones (:func:`~cellpilot.recommend.policy.default_oom_tolerance`), overridden for a
  fraction of jobs as users may.
* **Manual limits** (§2.3, §4.2): owners size a job once from what they saw on the first
  day and rarely change it. Each owner pads the first day's 95 %ile of 5-minute average
  usage so that the relative slack *on that day* is a draw from a Beta distribution whose
  mean is what §4.2 reports for manually-limited jobs (60 % with hard RAM limits, 46 %
  with soft ones), never below the first day's peak for hard limits. That is the one
  calibration to the paper: later growth, roll-outs and leaks move each job's slack from
  there (and cause the manual baseline's OOMs). Limits are rounded up to "round" values
  (eight steps per power of two), as people do.

Units: memory in bytes, CPU in millicores. Time origin 0 is the Unix epoch (a Thursday, 00:00 UTC).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from cellpilot.array_types import Float32Array, FloatArray
from cellpilot.job_vocabulary import AppClass, LatencySensitivity, OomTolerance
from cellpilot.recommend.policy import default_oom_tolerance
from cellpilot.units import GIB, MIB
from cellpilot.workloads.task_signals import (
    DAY_MS,
    WINDOW_MS,
    WINDOWS_PER_DAY,
    JobSignals,
    JobTraits,
    TaskSignal,
)

# The tolerances an override draws from, in the order the generator has always drawn them.
OOM_TOLERANCES = (OomTolerance.MINIMAL, OomTolerance.LOW, OomTolerance.INTERMEDIATE)


@dataclass(frozen=True)
class ManualLimitModel:
    """How owners set manual limits (see the module docstring).

    Beta(a, b) of the first-day relative slack an owner aims for: (2.4, 1.6) has mean 0.60
    (§4.2, hard RAM limits), (1.84, 2.16) mean 0.46 (soft). ``*_peak_floor``: a hard-limit
    owner never sets the limit below this multiple of the first day's peak (an immediate OOM
    would be noticed); soft limits are forgiving, so their owners may.
    """

    hard_slack_beta: tuple[float, float] = (2.4, 1.6)
    soft_slack_beta: tuple[float, float] = (1.84, 2.16)
    cpu_slack_beta: tuple[float, float] = (2.4, 1.6)
    hard_peak_floor: float = 1.05
    soft_peak_floor: float = 0.0
    reference_days: int = 1


@dataclass(frozen=True)
class AutopilotWorkloadConfig:
    """The population and its priors; ``days`` is the whole grid (warm-up included)."""

    jobs: int = 500
    days: int = 16
    seed: int = 0
    origin_ms: int = 0
    with_cpu: bool = True
    batch_fraction: float = 0.15
    leak_fraction: float = 0.10  # of serving jobs
    max_tasks: int = 2500
    # Task-count mixture: (probability, low, high), log-uniform within each component.
    task_mixture: tuple[tuple[float, int, int], ...] = ((0.60, 1, 10), (0.32, 10, 100), (0.07, 100, 1000))
    memory_median_bytes: float = 1.5 * GIB  # per task, log-normal across jobs
    memory_sigma: float = 1.0
    cpu_median_millicores: float = 500.0
    cpu_sigma: float = 1.0
    tolerance_override_fraction: float = 0.2
    machine_memory_bytes: float = 256 * GIB  # §4.1.1's "(largish) machine", used for job size
    manual: ManualLimitModel = field(default_factory=ManualLimitModel)

    @property
    def windows(self) -> int:
        return self.days * WINDOWS_PER_DAY

    def __post_init__(self) -> None:
        if self.jobs < 0 or self.days < 1:
            raise ValueError("need jobs >= 0 and days >= 1")
        if sum(p for p, _, _ in self.task_mixture) > 1.0 + 1e-9:
            raise ValueError("task mixture probabilities exceed 1")


def _task_count(rng: np.random.Generator, config: AutopilotWorkloadConfig) -> int:
    u = rng.random()
    low, high = 1000, config.max_tasks  # the remaining probability: thousands of tasks
    for p, lo, hi in config.task_mixture:
        if u < p:
            low, high = lo, hi
            break
        u -= p
    high = min(high, config.max_tasks)
    low = min(low, high)
    return int(min(high, math.floor(math.exp(rng.uniform(math.log(low), math.log(high + 1))))))


def _round_up(values: FloatArray) -> FloatArray:
    """Round up to eight steps per power of two (e.g. 3.3 GiB -> 3.5 GiB), as owners do."""
    v = np.maximum(np.asarray(values, dtype=np.float64), 1.0)
    step = np.exp2(np.floor(np.log2(v)) - 3.0)
    return np.asarray(np.ceil(v / step) * step, dtype=np.float64)


@dataclass(frozen=True)
class _Grid:
    windows: int
    day: FloatArray  # (T,) window mid-point in days since the epoch
    weekend: npt.NDArray[np.bool_]

    @classmethod
    def build(cls, config: AutopilotWorkloadConfig) -> _Grid:
        mid_ms = config.origin_ms + (np.arange(config.windows) + 0.5) * WINDOW_MS
        day = mid_ms / DAY_MS
        weekday = (np.floor(day).astype(np.int64) + 3) % 7  # 1970-01-01 was a Thursday; Monday = 0
        return cls(config.windows, day, weekday >= 5)


def _spikes(rng: np.random.Generator, windows: int, per_day: float) -> FloatArray:
    """Job-wide load spikes: a (T,) indicator-with-magnitude in [0, 1] (1 = full spike)."""
    out = np.zeros(windows)
    count = rng.poisson(per_day * windows / WINDOWS_PER_DAY)
    for _ in range(count):
        start = int(rng.integers(0, windows))
        length = int(rng.integers(1, 13))  # 5 minutes to an hour
        out[start : start + length] = np.maximum(out[start : start + length], rng.uniform(0.3, 1.0))
    return out


def _rollouts(
    rng: np.random.Generator, windows: int, tasks: int
) -> tuple[FloatArray, FloatArray, npt.NDArray[np.bool_]]:
    """Per-task memory and CPU level multipliers (T, n) and the restart flags of roll-outs."""
    memory = np.ones((windows, tasks))
    cpu = np.ones((windows, tasks))
    restart = np.zeros((windows, tasks), dtype=bool)
    interval_days = rng.uniform(3.0, 21.0)
    count = rng.poisson(windows / WINDOWS_PER_DAY / interval_days)
    for _ in range(count):
        at = int(rng.integers(WINDOWS_PER_DAY // 4, windows))  # none in the first hours
        spread = int(rng.integers(12, 49))  # a rolling update over 1-4 hours
        switch = at + rng.integers(0, spread, size=tasks)
        step_memory = float(np.exp(rng.normal(0.0, 0.10)))
        step_cpu = float(np.exp(rng.normal(0.0, 0.12)))
        after = np.arange(windows)[:, None] >= switch[None, :]
        memory = np.where(after, memory * step_memory, memory)
        cpu = np.where(after, cpu * step_cpu, cpu)
        inside = switch < windows
        restart[switch[inside], np.flatnonzero(inside)] = True
    return memory, cpu, restart


# (memory mean, memory peak, cpu mean, cpu peak, restarts, memory leak per window, job kind)
_JobUsage = tuple[
    Float32Array, Float32Array, Float32Array, Float32Array, npt.NDArray[np.bool_], Float32Array, str
]


def _job_usage(
    memory_mean: npt.NDArray[np.float64],
    memory_peak: npt.NDArray[np.float64],
    cpu_mean: npt.NDArray[np.float64],
    cpu_peak: npt.NDArray[np.float64],
    restart: npt.NDArray[np.bool_],
    leak_per_window: npt.NDArray[np.float64],
    kind: str,
) -> _JobUsage:
    """A generated job's usage, its signals stored as float32."""
    return (
        memory_mean.astype(np.float32),
        memory_peak.astype(np.float32),
        cpu_mean.astype(np.float32),
        cpu_peak.astype(np.float32),
        restart,
        leak_per_window.astype(np.float32),
        kind,
    )


def _serving_usage(
    rng: np.random.Generator, config: AutopilotWorkloadConfig, grid: _Grid, tasks: int, leak: bool
) -> _JobUsage:
    t = grid.windows
    task_sigma = rng.uniform(0.02, 0.25)
    size = np.exp(rng.normal(0.0, task_sigma, size=tasks))
    memory_base = (
        np.clip(config.memory_median_bytes * np.exp(rng.normal(0.0, config.memory_sigma)), 64 * MIB, 48 * GIB)
        * size
    )
    cpu_base = (
        np.clip(config.cpu_median_millicores * np.exp(rng.normal(0.0, config.cpu_sigma)), 10.0, 32_000.0)
        * size
    )
    peak_hour = rng.uniform(0.0, 1.0)
    wave = np.cos(2.0 * np.pi * (grid.day % 1.0 - peak_hour))
    growth = np.exp(rng.normal(0.003, 0.01) * (grid.day - grid.day[0]))
    spikes = _spikes(rng, t, rng.uniform(0.0, 1.5))
    memory_shape = (
        (1.0 + rng.uniform(0.0, 0.3) * wave)
        * (1.0 - rng.uniform(0.0, 0.15) * grid.weekend)
        * growth
        * (1.0 + rng.uniform(0.05, 0.4) * spikes)
    )
    cpu_shape = (
        (1.0 + rng.uniform(0.1, 0.7) * wave)
        * (1.0 - rng.uniform(0.0, 0.3) * grid.weekend)
        * growth
        * (1.0 + rng.uniform(0.2, 1.5) * spikes)
    )
    memory_level, cpu_level, restart = _rollouts(rng, t, tasks)
    memory_noise = rng.uniform(0.003, 0.03)
    memory_mean = (
        memory_base[None, :]
        * memory_shape[:, None]
        * memory_level
        * np.maximum(1.0 + memory_noise * rng.standard_normal((t, tasks)), 0.5)
    )
    memory_peak = memory_mean * (1.0 + rng.uniform(0.005, 0.04) * rng.standard_exponential((t, tasks)))
    if config.with_cpu:
        cpu_noise = rng.uniform(0.05, 0.3)
        cpu_mean = (
            cpu_base[None, :]
            * cpu_shape[:, None]
            * cpu_level
            * np.maximum(1.0 + cpu_noise * rng.standard_normal((t, tasks)), 0.05)
        )
        cpu_peak = cpu_mean * (1.0 + np.exp(rng.normal(np.log(0.5), 0.5, size=(t, tasks))))
    else:
        cpu_mean = np.zeros((t, tasks))
        cpu_peak = np.zeros((t, tasks))
    leak_per_window = np.zeros(tasks)
    if leak:
        leak_per_window = memory_base * rng.uniform(0.03, 0.4) / WINDOWS_PER_DAY
    kind = "serving-leak" if leak else "serving"
    return _job_usage(memory_mean, memory_peak, cpu_mean, cpu_peak, restart, leak_per_window, kind)


def _batch_usage(
    rng: np.random.Generator, config: AutopilotWorkloadConfig, grid: _Grid, slots: int
) -> _JobUsage:
    t = grid.windows
    memory_base = np.clip(
        config.memory_median_bytes * np.exp(rng.normal(0.0, config.memory_sigma)), 64 * MIB, 48 * GIB
    )
    cpu_base = np.clip(
        config.cpu_median_millicores * np.exp(rng.normal(0.0, config.cpu_sigma)), 10.0, 32_000.0
    )
    mean_life = rng.uniform(24.0, 144.0)  # 2-12 hours, in windows
    instances = int(t / 6) + 2
    life = np.maximum(6, rng.exponential(mean_life, size=(slots, instances)).astype(np.int64))
    gap = rng.integers(0, 3, size=(slots, instances))
    starts = np.cumsum(life + gap, axis=1) - (life + gap) - rng.integers(0, life[:, :1] + 1)
    windows = np.arange(t)
    memory_mean = np.full((t, slots), np.nan)
    restart = np.zeros((t, slots), dtype=bool)
    instance_peak = memory_base * np.exp(rng.normal(0.0, 0.25, size=(slots, instances)))
    for i in range(slots):
        k = np.searchsorted(starts[i], windows, side="right") - 1
        valid = k >= 0
        kk = np.maximum(k, 0)
        age = windows - starts[i][kk]
        running = valid & (age < life[i][kk])
        ramp = np.minimum(1.0, (age + 1) / np.maximum(1.0, 0.25 * life[i][kk]))
        memory_mean[running, i] = (instance_peak[i][kk] * (0.3 + 0.7 * ramp))[running]
        first = running & ((age == 0) | (windows == 0))
        restart[first, i] = True
    noise = np.maximum(1.0 + rng.uniform(0.003, 0.02) * rng.standard_normal((t, slots)), 0.5)
    memory_mean = memory_mean * noise
    memory_peak = memory_mean * (1.0 + rng.uniform(0.005, 0.04) * rng.standard_exponential((t, slots)))
    running = ~np.isnan(memory_mean)
    if config.with_cpu:
        cpu_mean = np.where(
            running, cpu_base * np.maximum(1.0 + 0.1 * rng.standard_normal((t, slots)), 0.1), np.nan
        )
        cpu_peak = cpu_mean * (1.0 + np.exp(rng.normal(np.log(0.2), 0.5, size=(t, slots))))
    else:
        cpu_mean = np.where(running, 0.0, np.nan)
        cpu_peak = cpu_mean.copy()
    return _job_usage(memory_mean, memory_peak, cpu_mean, cpu_peak, restart, np.zeros(slots), "batch")


def _nominal_leak(restart: npt.NDArray[np.bool_], leak: Float32Array) -> FloatArray:
    """Leak growth per task-window if no OOM ever restarts a task: leak x windows since a restart."""
    t = restart.shape[0]
    index = np.where(restart, np.arange(t)[:, None], 0)
    np.maximum.accumulate(index, axis=0, out=index)
    return np.asarray((np.arange(t)[:, None] - index) * leak[None, :].astype(np.float64))


def _manual_limits(
    rng: np.random.Generator,
    model: ManualLimitModel,
    memory_mean: Float32Array,
    memory_peak: FloatArray,
    cpu_mean: Float32Array,
) -> tuple[float, float, float]:
    """(hard-owner, soft-owner) memory limits and the CPU limit, set from the reference days."""
    reference = slice(0, model.reference_days * WINDOWS_PER_DAY)
    means = memory_mean[reference]
    running = ~np.isnan(means)
    if not running.any():  # a batch job idle on its first day: size from whatever it ran
        reference = slice(0, memory_mean.shape[0])
        means = memory_mean[reference]
        running = ~np.isnan(means)
    usage = float(np.percentile(means[running], 95))
    peak = float(np.nanmax(memory_peak[reference]))
    hard_slack = rng.beta(*model.hard_slack_beta)
    soft_slack = rng.beta(*model.soft_slack_beta)
    hard = max(usage / (1.0 - hard_slack), model.hard_peak_floor * peak)
    soft = max(usage / (1.0 - soft_slack), model.soft_peak_floor * peak)
    cpu_values = cpu_mean[reference][running]
    cpu_usage = float(np.percentile(cpu_values, 95)) if cpu_values.size else 0.0
    cpu = cpu_usage / (1.0 - rng.beta(*model.cpu_slack_beta))
    hard_r, soft_r = _round_up(np.array([hard, soft]))
    cpu_r = float(np.ceil(max(cpu, 1.0)))  # whole milli-cores (Borg §2.3)
    return float(hard_r), float(soft_r), cpu_r


def generate_job(config: AutopilotWorkloadConfig, job: int) -> JobSignals:
    """Job number ``job`` of the population (deterministic in ``(config.seed, job)``)."""
    rng = np.random.default_rng([config.seed, job])
    grid = _Grid.build(config)
    tasks = _task_count(rng, config)
    is_batch = rng.random() < config.batch_fraction
    leak = (not is_batch) and rng.random() < config.leak_fraction
    if is_batch:
        mm, mp, cm, cp, restart, leak_rate, kind = _batch_usage(rng, config, grid, tasks)
    else:
        mm, mp, cm, cp, restart, leak_rate, kind = _serving_usage(rng, config, grid, tasks, leak)
    nominal_peak = mp.astype(np.float64) + _nominal_leak(restart, leak_rate)
    hard, soft, cpu_limit = _manual_limits(rng, config.manual, mm, nominal_peak, cm)
    running = ~np.isnan(mm)
    footprint_machines = tasks * hard / config.machine_memory_bytes
    tolerance = default_oom_tolerance(footprint_machines)
    if rng.random() < config.tolerance_override_fraction:
        others = [t for t in OOM_TOLERANCES if t is not tolerance]
        tolerance = others[int(rng.integers(0, len(others)))]
    latency = (
        LatencySensitivity.HIGH if (not is_batch and rng.random() < 0.5) else LatencySensitivity.MODERATE
    )
    traits = JobTraits(
        job_class=AppClass.BATCH if is_batch else AppClass.LATENCY_SENSITIVE,
        latency=latency,
        oom_tolerance=tolerance,
        priority=100 if is_batch else 200,
        kind=kind,
    )
    shape = mm.shape

    def constant(value: float) -> Float32Array:
        return np.where(running, np.float32(value), np.float32(np.nan)).astype(np.float32)

    return JobSignals(
        job_id=job,
        traits=traits,
        memory_mean=mm,
        memory_peak=mp,
        cpu_mean=cm,
        cpu_peak=cp,
        memory_limit_hard=constant(hard),
        memory_limit_soft=constant(soft),
        cpu_limit=constant(cpu_limit) if config.with_cpu else np.full(shape, np.nan, dtype=np.float32),
        restart=restart,
        memory_leak_per_window=leak_rate,
    )


def generate_jobs(config: AutopilotWorkloadConfig, jobs: range | None = None) -> Iterator[JobSignals]:
    """Jobs ``jobs`` (default: all ``config.jobs``) of the population, one at a time."""
    for job in jobs if jobs is not None else range(config.jobs):
        yield generate_job(config, job)


def generate_task_signals(config: AutopilotWorkloadConfig) -> Iterator[TaskSignal]:
    """The population as per-task signals, the form the trace readers yield."""
    for job in generate_jobs(config):
        yield from job.task_signals()


def task_counts(config: AutopilotWorkloadConfig, jobs: range | None = None) -> list[int]:
    """Each job's task count without generating its usage (for balancing work across processes)."""
    out = []
    for job in jobs if jobs is not None else range(config.jobs):
        rng = np.random.default_rng([config.seed, job])
        out.append(_task_count(rng, config))
    return out
