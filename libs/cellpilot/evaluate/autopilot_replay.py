"""Closed-loop, trace-driven replay of vertical limits (Autopilot §3.2, §4, §5.1's off-line simulation).

For each job, window by window (5 minutes) in event time, every compared decider
(:mod:`cellpilot.evaluate.autopilot_deciders`: Autopilot as the services run it, manual
limits, VPA, the clairvoyant bound) sees the usage its own limits allowed, decides, and its
limit takes effect ``actuation_delay_ms`` after the window in which it was decided (at the
earliest the next window); that limit shapes the usage the next window sees. Consequences (§2.3):

* **hard RAM limit**: a task whose 5-minute peak exceeds its limit is OOM-killed (one OOM
  per task and window) and restarts; the monitoring saw usage up to the limit;
* **soft RAM limit**: a task over its limit is killed only while its machine is short of
  memory. The replay places its tasks on machines and judges each window with the Borglet's
  enforcement over the co-located replayed tasks (:mod:`cellpilot.evaluate.replay_machines`:
  the placement, shared by every setter so the comparison is paired, and why a machine runs
  short); the monitoring saw the killed task's usage up to its peak;
* a restart costs ``restart_seconds`` of runtime and resets any memory growth since the
  task's start (a leak); a planned restart (roll-out) does too;
* **CPU** (optional): usage above the limit is throttled, the monitoring sees the throttled
  usage, and the throttled share of the offered CPU is reported.

Unlike the paper's off-line tuning (§3.2.3 "raw (unadjusted) usage traces"), the observed
signal here is adjusted by the limits in force, which is what makes OOMs and their cost
visible. Per-job-day metrics are in :mod:`cellpilot.evaluate.autopilot_metrics`; the first
``warmup_days`` are replayed but not measured (the paper studies long-running jobs).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from cellpilot.array_types import BoolArray, Float32Array, FloatArray
from cellpilot.autopilot.decisions import DecisionPolicy
from cellpilot.autopilot.ml_config import hyperparameters, load_ml_config, options
from cellpilot.evaluate.autopilot_bound import bound_limits, usage_floor
from cellpilot.evaluate.autopilot_deciders import (
    AutopilotDecider,
    ChunkLayout,
    Decider,
    Enforcement,
    ManualDecider,
    ManualResponse,
    Observation,
    PolicyKind,
    RecommenderSpec,
    VpaDecider,
)
from cellpilot.evaluate.autopilot_metrics import (
    OOM_TOLERANCES,
    DayAccumulator,
    Goal,
    JobDays,
    add_bound_ratios,
    goals,
    summarise_study,
)
from cellpilot.evaluate.replay_machines import CellModel, ReplayMachines, place_tasks, pools_of
from cellpilot.evaluate.sharding import IN_PROCESS, ShardRunner
from cellpilot.evaluate.vpa import VpaConfig
from cellpilot.job_vocabulary import AppClass
from cellpilot.recommend.ml_ensemble import EnsembleConfig
from cellpilot.units import GIB
from cellpilot.usage.buckets import Resource
from cellpilot.workloads.autopilot_jobs import AutopilotWorkloadConfig, generate_job, task_counts
from cellpilot.workloads.task_signals import WINDOW_MS, WINDOWS_PER_DAY, JobSignals


@dataclass(frozen=True)
class ReplayConfig:
    warmup_days: int = 2
    actuation_delay_ms: int = WINDOW_MS
    machine_memory_bytes: float = 256 * GIB
    restart_seconds: float = 60.0
    cell: CellModel = field(default_factory=CellModel)  # which replayed tasks share machines
    manual_response: ManualResponse = field(default_factory=ManualResponse)
    cpu: bool = False
    # The recommender workers' ML configuration: the shipped (tuned) file unless overridden.
    ml: EnsembleConfig = field(default_factory=load_ml_config)
    # The master's decision settings (dead band, AUTO's choice); the largest machine is
    # ``machine_memory_bytes``.
    master: DecisionPolicy = field(default_factory=DecisionPolicy)
    vpa: VpaConfig = field(default_factory=VpaConfig)

    @property
    def delay_windows(self) -> int:
        return max(0, math.ceil(self.actuation_delay_ms / WINDOW_MS))

    def describe(self) -> dict[str, Any]:
        out = asdict(self)
        out["ml"] = {**hyperparameters(self.ml), **options(self.ml), "models": self.ml.grid.models}
        return out

    def master_policy(self) -> DecisionPolicy:
        return replace(self.master, machine_memory_bytes=self.machine_memory_bytes)


# -- a chunk of jobs stacked along the task axis ---------------------------------------------


@dataclass(frozen=True, eq=False)
class Chunk:
    job_ids: npt.NDArray[np.int64]
    layout: ChunkLayout
    memory_mean: Float32Array
    memory_peak: Float32Array
    limit_hard: Float32Array
    limit_soft: Float32Array
    cpu_mean: Float32Array
    cpu_peak: Float32Array
    cpu_limit: Float32Array
    cpu_deciles: Float32Array | None
    restart: BoolArray
    running: BoolArray
    leak: FloatArray
    machines: ReplayMachines

    @property
    def windows(self) -> int:
        return int(self.memory_mean.shape[0])

    @classmethod
    def build(cls, jobs: Sequence[JobSignals], config: ReplayConfig) -> Chunk:
        """Stack the jobs' tasks; the chunk's first job starts a pool of machines."""
        with_cpu = config.cpu
        if not jobs:
            raise ValueError("empty chunk")
        windows = {j.windows for j in jobs}
        if len(windows) != 1:
            raise ValueError("all jobs of a study share one window grid")
        sizes = np.array([j.tasks for j in jobs])
        bounds = np.concatenate(([0], np.cumsum(sizes))).astype(np.intp)

        def stack(name: str) -> Float32Array:
            return np.ascontiguousarray(np.concatenate([getattr(j, name) for j in jobs], axis=1))

        deciles = None
        if with_cpu and all(j.cpu_deciles is not None for j in jobs):
            deciles = np.concatenate([j.cpu_deciles for j in jobs if j.cpu_deciles is not None], axis=1)
        empty = np.zeros((1, 1), dtype=np.float32)
        job_of_task = np.repeat(np.arange(len(jobs)), sizes).astype(np.intp)
        limit_hard = stack("memory_limit_hard")
        with np.errstate(invalid="ignore"):
            requests = np.nanmax(np.where(np.isfinite(limit_hard), limit_hard, np.nan), axis=0, initial=0.0)
        cell = config.cell
        machine, count = place_tasks(
            requests,
            pools_of(len(jobs), cell.pool_jobs)[job_of_task],
            cell.overcommit * config.machine_memory_bytes,
        )
        machines = ReplayMachines(
            machine=machine,
            count=count,
            priority=np.array([j.traits.priority for j in jobs], dtype=np.int64)[job_of_task],
            free_bytes=cell.free_fraction * config.machine_memory_bytes,
            memory_bytes=config.machine_memory_bytes,
            overcommit=cell.overcommit,
        )
        return cls(
            job_ids=np.array([j.job_id for j in jobs], dtype=np.int64),
            layout=ChunkLayout(job_of_task, bounds, tuple(j.traits for j in jobs)),
            memory_mean=stack("memory_mean"),
            memory_peak=stack("memory_peak"),
            limit_hard=limit_hard,
            limit_soft=stack("memory_limit_soft"),
            cpu_mean=stack("cpu_mean") if with_cpu else empty,
            cpu_peak=stack("cpu_peak") if with_cpu else empty,
            cpu_limit=stack("cpu_limit") if with_cpu else empty,
            cpu_deciles=deciles,
            restart=np.ascontiguousarray(np.concatenate([j.restart for j in jobs], axis=1)),
            running=np.ascontiguousarray(np.concatenate([j.running for j in jobs], axis=1)),
            leak=np.concatenate([j.memory_leak_per_window for j in jobs]).astype(np.float64),
            machines=machines,
        )


CPU_POINTS = 10


def cpu_points(
    mean: Float32Array, peak: Float32Array, deciles: Float32Array | None
) -> tuple[FloatArray, FloatArray]:
    """Ten usage points per task-window, each standing for 10 % of its samples: (N, 10), (N, 10).

    With the 2019 traces' deciles: the mid-points between consecutive deciles. Otherwise,
    from the window's average and peak only: nine points at a level ``a`` and one at the
    peak, with ``a`` chosen so the points average to the recorded mean (a = (10 mean -
    peak) / 9, at least 0).
    """
    m = mean.astype(np.float64)
    p = np.fmax(peak.astype(np.float64), m)
    a = np.maximum((10.0 * m - p) / 9.0, 0.0)
    points = np.concatenate((np.repeat(a[:, None], CPU_POINTS - 1, axis=1), p[:, None]), axis=1)
    if deciles is not None:
        d = deciles.astype(np.float64)
        middle = 0.5 * (d[:, :-1] + d[:, 1:])
        known = np.asarray(np.isfinite(middle).all(axis=1), dtype=bool)
        points = np.where(known[:, None], middle, points)
    return points, np.full(points.shape, 1.0 / CPU_POINTS)


# -- one compared setter running over a chunk ---------------------------------------------------


class Actuation:
    """The job-level limits a setter asked for, applied after the actuation delay."""

    def __init__(self, jobs: int, delay_windows: int) -> None:
        self.ring = delay_windows + 1
        self.pending = np.full((self.ring, jobs), np.nan)
        self.applied = np.full(jobs, np.nan)
        self.decided = np.full(jobs, np.nan)

    def start_window(self, window: int) -> None:
        due = self.pending[window % self.ring]
        has = ~np.isnan(due)
        self.applied[has] = due[has]
        due.fill(np.nan)

    def decide(self, window: int, value: FloatArray) -> None:
        # Written into the slot just emptied: it comes round again delay + 1 windows later.
        new = ~np.isnan(value) & (value != self.decided)
        self.pending[window % self.ring][new] = value[new]
        self.decided[new] = value[new]


def _decider(
    spec: RecommenderSpec, layout: ChunkLayout, resource: Resource, config: ReplayConfig
) -> Decider | None:
    if spec.kind.is_autopilot:
        return AutopilotDecider(spec.kind, layout, resource, spec.ml or config.ml, config.master_policy())
    if spec.kind is PolicyKind.VPA:
        return VpaDecider(layout, resource, config.vpa)
    if spec.kind is PolicyKind.CLAIRVOYANT:
        return None  # no history: the replay hands it the window's peak (see _Run)
    if resource is Resource.MEMORY:
        return ManualDecider(layout, config.manual_response)
    return None  # manual CPU limits are never changed (throttling pages nobody)


class _Run:
    """One setter replayed over a chunk: its limits, consequences and day accounting."""

    def __init__(self, spec: RecommenderSpec, chunk: Chunk, config: ReplayConfig) -> None:
        self.spec = spec
        self.chunk = chunk
        self.config = config
        layout = chunk.layout
        n = int(layout.bounds[-1])
        self.manual = chunk.limit_hard if spec.manual_owner is Enforcement.HARD else chunk.limit_soft
        self.setter = _decider(spec, layout, Resource.MEMORY, config)
        self.actuation = Actuation(layout.jobs, config.delay_windows)
        self.growth = np.zeros(n)
        self.previous_limit = np.full(n, np.nan)
        self.previous_running = np.zeros(n, dtype=bool)
        self.restart_fraction = min(1.0, config.restart_seconds * 1000.0 / WINDOW_MS)
        self.days = DayAccumulator(layout.bounds, WINDOWS_PER_DAY)
        self.rows: list[JobDays] = []
        self.cpu_setter = _decider(spec, layout, Resource.CPU, config) if config.cpu else None
        self.cpu_actuation = Actuation(layout.jobs, config.delay_windows)
        self.floor = np.full(layout.jobs, np.nan)  # the bound's, for the current day

    def _limits(self, manual: Float32Array, actuation: Actuation) -> FloatArray:
        job = self.chunk.layout.job_of_task
        applied = actuation.applied[job]
        if self.spec.kind is PolicyKind.MANUAL:
            return np.fmax(manual.astype(np.float64), applied)  # NaN floor: the manual limit
        return np.where(np.isnan(applied), manual, applied)

    def _clairvoyant(self, manual: Float32Array, job_limit: FloatArray) -> FloatArray:
        """The bound's job limits on every task; where it has none, the manual limit."""
        limit = job_limit[self.chunk.layout.job_of_task]
        return np.where(np.isnan(limit), manual.astype(np.float64), limit)

    def _day_floor(self, t: int) -> None:
        """The bound's floor for the day starting at window ``t``, from the growth before
        window ``t``'s restarts (:func:`~cellpilot.evaluate.autopilot_bound.usage_floor`)."""
        chunk, day = self.chunk, slice(t, t + WINDOWS_PER_DAY)
        self.floor = usage_floor(
            chunk.layout,
            chunk.memory_mean[day],
            chunk.running[day],
            chunk.restart[day],
            chunk.leak,
            self.growth,
        )

    def window(self, t: int) -> None:
        chunk, layout = self.chunk, self.chunk.layout
        self.actuation.start_window(t)
        running = chunk.running[t]
        hard = self.spec.enforcement is Enforcement.HARD
        bound = self.spec.kind is PolicyKind.CLAIRVOYANT
        if bound and t % WINDOWS_PER_DAY == 0:
            self._day_floor(t)
        self.growth[chunk.restart[t]] = 0.0
        peak = chunk.memory_peak[t] + self.growth
        mean = chunk.memory_mean[t] + self.growth
        if bound:
            job_limit = bound_limits(layout, chunk.machines, running, peak, self.floor, hard)
            limit = self._clairvoyant(self.manual[t], job_limit)
        else:
            limit = self._limits(self.manual[t], self.actuation)
        oom = chunk.machines.memory_kills(running, peak, limit, hard)
        # A hard limit kills at the limit; a soft-limit task dies at the machine's shortage,
        # at its peak (replay_machines).
        observed = np.where(oom & hard, np.minimum(peak, limit), peak)
        weight = np.where(running, 1.0 - self.restart_fraction * oom, 0.0)
        changed = running & self.previous_running & (limit != self.previous_limit)
        changes = np.bincount(layout.job_of_task[changed], minlength=layout.jobs) > 0
        self.previous_limit, self.previous_running = limit, running
        self.days.add(t % WINDOWS_PER_DAY, limit, mean, weight, oom, changes.astype(np.int64))
        if self.setter is not None:
            obs = Observation(t, self.time_ms(t), running, observed, oom, limit, self.actuation.applied)
            self.actuation.decide(t, self.setter.step(obs))
        self.growth = np.where(oom, 0.0, self.growth + chunk.leak * running)
        if self.config.cpu:
            self._cpu_window(t, running, weight)

    def _cpu_window(self, t: int, running: BoolArray, weight: FloatArray) -> None:
        chunk = self.chunk
        self.cpu_actuation.start_window(t)
        deciles = None if chunk.cpu_deciles is None else chunk.cpu_deciles[t]
        points, fractions = cpu_points(chunk.cpu_mean[t], chunk.cpu_peak[t], deciles)
        points = np.where(running[:, None], points, 0.0)
        if self.spec.kind is PolicyKind.CLAIRVOYANT:
            # CPU is throttled, never killed: the bound is each window's job peak, known ahead.
            job_peak = chunk.layout.per_job_max(np.where(running, points.max(axis=1), np.nan))
            limit = self._clairvoyant(chunk.cpu_limit[t], job_peak)
        else:
            limit = self._limits(chunk.cpu_limit[t], self.cpu_actuation)
        capped = np.where(np.isnan(limit)[:, None], points, np.minimum(points, limit[:, None]))
        demand = (points * fractions).sum(axis=1)
        served = (capped * fractions).sum(axis=1)
        self.days.add_cpu(t % WINDOWS_PER_DAY, np.where(np.isnan(limit), 0.0, limit), served, demand, weight)
        if self.cpu_setter is not None:
            obs = Observation(
                t,
                self.time_ms(t),
                running,
                served,
                np.zeros_like(running),
                limit,
                self.cpu_actuation.applied,
                points=capped,
                fractions=fractions,
            )
            self.cpu_actuation.decide(t, self.cpu_setter.step(obs))

    @staticmethod
    def time_ms(t: int) -> int:
        return (t + 1) * WINDOW_MS

    def close_day(self, day: int, measured: bool) -> None:
        traits = self.chunk.layout.traits
        serving = np.array([t.job_class is AppClass.LATENCY_SENSITIVE for t in traits])
        tolerance = np.array([OOM_TOLERANCES.index(t.oom_tolerance.value) for t in traits], dtype=np.int64)
        rows = self.days.close_day(self.chunk.job_ids, day, serving, tolerance)
        if measured:
            self.rows.append(rows)


def replay_chunk(
    jobs: Sequence[JobSignals], specs: Sequence[RecommenderSpec], config: ReplayConfig
) -> dict[str, JobDays]:
    """Replay every setter over the jobs (one chunk); per setter the measured job-days."""
    chunk = Chunk.build(jobs, config)
    runs = [_Run(spec, chunk, config) for spec in specs]
    for t in range(chunk.windows):
        for run in runs:
            run.window(t)
        if (t + 1) % WINDOWS_PER_DAY == 0:
            day = (t + 1) // WINDOWS_PER_DAY - 1
            for run in runs:
                run.close_day(day, day >= config.warmup_days)
    return {run.spec.name: JobDays.concat(run.rows) for run in runs}


# -- a whole study: chunks of jobs, one shard each ------------------------------------------------


@dataclass(frozen=True)
class SyntheticChunk:
    workload: AutopilotWorkloadConfig
    jobs: tuple[int, ...]


@dataclass(frozen=True)
class TraceChunk:
    jobs: tuple[JobSignals, ...]


def _run_chunk(
    context: tuple[tuple[RecommenderSpec, ...], ReplayConfig], item: SyntheticChunk | TraceChunk
) -> dict[str, JobDays]:
    """One shard: a chunk's jobs replayed through every setter (pure; the draws depend on job ids)."""
    specs, config = context
    if isinstance(item, SyntheticChunk):
        jobs: Sequence[JobSignals] = [generate_job(item.workload, j) for j in item.jobs]
    else:
        jobs = item.jobs
    return replay_chunk(jobs, specs, config)


def plan_chunks(
    sizes: Sequence[int], max_tasks: int = 2000, max_jobs: int = 64, pool_jobs: int = 1
) -> list[list[int]]:
    """Group job indices into chunks of at most ``max_tasks`` tasks and ``max_jobs`` jobs (in order).

    Pools of ``pool_jobs`` consecutive jobs (which share machines) are never split: a pool
    larger than the limits is a chunk of its own.
    """
    chunks: list[list[int]] = []
    current: list[int] = []
    tasks = 0
    for start in range(0, len(sizes), pool_jobs):
        pool = list(range(start, min(start + pool_jobs, len(sizes))))
        size = sum(sizes[i] for i in pool)
        if current and (tasks + size > max_tasks or len(current) + len(pool) > max_jobs):
            chunks.append(current)
            current, tasks = [], 0
        current.extend(pool)
        tasks += size
    if current:
        chunks.append(current)
    return chunks


def _chunk_cost(jobs: int, tasks: int) -> float:
    """Relative replay cost of a chunk: the recommenders' per-job histograms dominate
    (measured: one job costs about as much as 75 tasks' per-task bookkeeping)."""
    return jobs + tasks / 75.0


@dataclass(frozen=True)
class StudyResult:
    rows: dict[str, JobDays]
    summaries: dict[str, dict[str, Any]]
    goals: list[Goal]
    measured_days: int
    replayed_job_days: int
    seconds: float
    settings: dict[str, Any]


def run_study(
    source: AutopilotWorkloadConfig | Sequence[JobSignals],
    specs: Sequence[RecommenderSpec],
    config: ReplayConfig,
    *,
    runner: ShardRunner = IN_PROCESS,
    progress: Callable[[int, int], None] | None = None,
    max_chunk_tasks: int = 2000,
    max_chunk_jobs: int = 64,
    population: str = "serving",
) -> StudyResult:
    """Replay every setter over a synthetic population or a trace's jobs; summarise per setter.

    Chunks of jobs are the shards (``runner``: in this process, or on a cluster); results
    are combined in chunk order, so the outcome does not depend on the runner.
    ``progress(done, total)`` is called with replayed job-days (all setters) after each chunk.
    """
    started = time.perf_counter()
    items: list[SyntheticChunk | TraceChunk]
    if isinstance(source, AutopilotWorkloadConfig):
        sizes = task_counts(source)
        plan = plan_chunks(sizes, max_chunk_tasks, max_chunk_jobs, config.cell.pool_jobs)
        items = [SyntheticChunk(source, tuple(c)) for c in plan]
        total_days = source.jobs * source.days
        grid_days = source.days
    else:
        trace_jobs = list(source)
        if not trace_jobs:
            raise ValueError("no jobs to replay")
        sizes = [j.tasks for j in trace_jobs]
        plan = plan_chunks(sizes, max_chunk_tasks, max_chunk_jobs, config.cell.pool_jobs)
        items = [TraceChunk(tuple(trace_jobs[i] for i in c)) for c in plan]
        grid_days = trace_jobs[0].windows // WINDOWS_PER_DAY
        total_days = len(trace_jobs) * grid_days
    chunk_cost = [_chunk_cost(len(c), sum(sizes[i] for i in c)) for c in plan]
    measured_days = grid_days - config.warmup_days
    if measured_days < 1:
        raise ValueError(
            f"{grid_days} whole days of data leave nothing to measure after {config.warmup_days} warm-up days"
        )
    spec_tuple = tuple(specs)
    done = 0
    if progress:
        progress(0, total_days)
    chunk_days = [len(c) * grid_days for c in plan]

    def finished(index: int) -> None:
        nonlocal done
        done += chunk_days[index]
        if progress:
            progress(done, total_days)

    results = runner.map(_run_chunk, (spec_tuple, config), items, costs=chunk_cost, on_done=finished)
    rows = {s.name: JobDays.concat([r[s.name] for r in results]) for s in spec_tuple}
    summaries = {
        name: summarise_study(r, config.machine_memory_bytes, measured_days, population)
        for name, r in rows.items()
    }
    add_bound_ratios(summaries)
    return StudyResult(
        rows=rows,
        summaries=summaries,
        goals=goals(summaries),
        measured_days=measured_days,
        replayed_job_days=total_days,
        seconds=time.perf_counter() - started,
        settings={
            "replay": config.describe(),
            "recommenders": [s.describe() for s in spec_tuple],
            "population": population,
        },
    )
