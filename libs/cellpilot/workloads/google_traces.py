"""The public Google cluster traces as per-task ``TaskSignal`` objects: formats, units and assembly.

**2011 (clusterdata-2011-2, schema v2.1)**: headerless CSV part files (``.csv`` or
``.csv.gz``) in a trace directory's ``task_usage/`` and ``task_events/`` folders.
``task_usage`` has 20 columns per row — start and end time (µs), job ID, task index,
machine ID, CPU rate (mean), canonical memory usage (mean), assigned memory, unmapped and
total page cache, maximum memory usage, disk I/O time, local disk space, maximum CPU rate,
maximum disk I/O time, cycles and memory accesses per instruction, sample portion,
aggregation type, sampled CPU usage (a random 1-second sample). ``task_events`` has 13 —
timestamp, missing info, job ID, task index, machine ID, event type, user, scheduling
class, priority, CPU request, memory request, disk request, different-machines
restriction. The requested CPU and memory (from every event that carries them, in force
from that event on) are the manual limits.

**2019 (clusterdata-2019, schema v3)**: newline-delimited JSON as BigQuery exports it
(``.json`` or ``.json.gz``) in ``instance_usage/`` and, optionally, ``instance_events/``.
``instance_usage`` rows have ``start_time`` / ``end_time`` (µs; BigQuery writes 64-bit
integers as strings), ``collection_id``, ``instance_index``, ``collection_type`` (0 = job,
1 = alloc set, skipped), ``average_usage`` and ``maximum_usage`` ``{cpus, memory}``,
``random_sample_usage {cpus}``, ``assigned_memory`` and ``cpu_usage_distribution`` (CPU at
the 0th, 10th, ..., 100th percentile of the window; kept as the window's CPU deciles) and
``tail_cpu_usage_distribution``. Requests come from ``instance_events``
``resource_request {cpus, memory}``; without events, ``assigned_memory`` is the memory limit.

Both traces normalise CPU and memory to the largest machine; :class:`MachineScale` turns
them into millicores and bytes (a nominal machine: footprint in machines is then the trace's
own unit). Both start at trace time 600 s; usage rows cover 5-minute periods, sometimes
shorter (a task starting or stopping): rows of one task falling in one window are merged
(time-weighted means, maxima of peaks).

This module is pure: reading the files and merging rows per task and window is the trace
ingest's job (``cellpilot.traces``, a columnar engine outside the core). What arrives
here is already merged — :class:`TaskWindows` and :class:`TaskRequests`, one batch of
jobs at a time — and :func:`assemble_tasks` lays each task's windows out as its series;
:func:`job_traits` turns the per-job aggregates into :class:`JobTraits`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cellpilot.array_types import FloatArray, Int64Array
from cellpilot.job_vocabulary import AppClass, LatencySensitivity
from cellpilot.recommend.policy import default_oom_tolerance
from cellpilot.units import GIB, MILLICORES_PER_CORE
from cellpilot.workloads.task_signals import (
    CPU_DECILES,
    WINDOW_MS,
    JobSignals,
    JobTraits,
    TaskSignal,
    group_tasks,
)

TASK_USAGE_COLUMNS: tuple[str, ...] = (
    "start_time",
    "end_time",
    "job_id",
    "task_index",
    "machine_id",
    "cpu_rate",
    "canonical_memory_usage",
    "assigned_memory_usage",
    "unmapped_page_cache",
    "total_page_cache",
    "maximum_memory_usage",
    "disk_io_time",
    "local_disk_space_usage",
    "maximum_cpu_rate",
    "maximum_disk_io_time",
    "cycles_per_instruction",
    "memory_accesses_per_instruction",
    "sample_portion",
    "aggregation_type",
    "sampled_cpu_usage",
)
TASK_EVENTS_COLUMNS: tuple[str, ...] = (
    "timestamp",
    "missing_info",
    "job_id",
    "task_index",
    "machine_id",
    "event_type",
    "user",
    "scheduling_class",
    "priority",
    "cpu_request",
    "memory_request",
    "disk_space_request",
    "different_machines_restriction",
)
WINDOW_US = WINDOW_MS * 1000
TRACE_START_US = 600_000_000  # both traces: trace time 600 s is the start of the data
PRODUCTION_PRIORITY = {"google2011": 9, "google2019": 120}  # serving = production tier and above
LATENCY_SENSITIVE_CLASS = 3  # scheduling class 3: the most latency-sensitive
TASK_BITS = 20  # a task is keyed as job << TASK_BITS | task index


@dataclass(frozen=True)
class MachineScale:
    """The nominal machine the traces' normalised units stand for."""

    memory_bytes: float = 256 * GIB
    cpu_millicores: float = 64.0 * MILLICORES_PER_CORE


@dataclass(frozen=True, eq=False)
class UsageRows:
    """Usage rows as columns (normalised units, times in µs), as the trace files hold them."""

    start_us: Int64Array
    end_us: Int64Array
    job_id: Int64Array
    task_index: Int64Array
    memory_mean: FloatArray
    memory_peak: FloatArray
    cpu_mean: FloatArray
    cpu_peak: FloatArray
    cpu_sample: FloatArray  # 2011: the sampled CPU usage; 2019: random_sample_usage.cpus
    assigned_memory: FloatArray  # the memory assigned to the container (fallback limit)
    cpu_deciles: FloatArray | None = None  # (rows, 11), 2019 only

    def __len__(self) -> int:
        return int(self.start_us.shape[0])


@dataclass(frozen=True, eq=False)
class EventRows:
    """Task events carrying requests (and the job's priority and scheduling class)."""

    time_us: Int64Array
    job_id: Int64Array
    task_index: Int64Array
    priority: Int64Array
    scheduling_class: Int64Array
    cpu_request: FloatArray  # NaN where the event carries none
    memory_request: FloatArray

    def __len__(self) -> int:
        return int(self.time_us.shape[0])

    @classmethod
    def empty(cls) -> EventRows:
        i, f = np.zeros(0, dtype=np.int64), np.zeros(0)
        return cls(i, i, i, i, i, f, f)


@dataclass(frozen=True, eq=False)
class TaskWindows:
    """Usage merged per task and window (normalised units), rows in any order.

    ``window`` counts from the trace's grid origin; one row per (task, window) in which the
    task has a memory sample. NaN where none of the window's rows carried the value.
    """

    job_id: Int64Array
    task_index: Int64Array
    window: Int64Array
    memory_mean: FloatArray
    memory_peak: FloatArray
    cpu_mean: FloatArray
    cpu_peak: FloatArray
    assigned_memory: FloatArray
    cpu_deciles: FloatArray | None = None  # (rows, 11); a row of NaN where unknown

    def __len__(self) -> int:
        return int(self.window.shape[0])


@dataclass(frozen=True, eq=False)
class TaskRequests:
    """Events that carry a request, sorted by (job, task, time, position in the trace).

    ``window`` is the grid window the event falls in (0 for events before the grid).
    """

    job_id: Int64Array
    task_index: Int64Array
    window: Int64Array
    cpu: FloatArray  # NaN where the event carries no CPU request
    memory: FloatArray

    def __len__(self) -> int:
        return int(self.window.shape[0])


@dataclass(frozen=True, eq=False)
class TraceTasks:
    """Task signals read from a trace, with each job's traits and the grid they sit on."""

    tasks: list[TaskSignal]
    traits: dict[int, JobTraits]
    windows: int
    origin_us: int

    def jobs(self, min_coverage: float = 0.9, serving_only: bool = False) -> list[JobSignals]:
        """Jobs stacked on the grid, keeping long-running ones (§4.1.2): some task of the job
        runs in at least ``min_coverage`` of the windows."""
        jobs = group_tasks(self.tasks, self.traits, self.windows)
        kept = []
        for job in jobs:
            coverage = float(job.running.any(axis=1).mean())
            if coverage >= min_coverage and (
                not serving_only or job.traits.job_class is AppClass.LATENCY_SENSITIVE
            ):
                kept.append(job)
        return kept


def task_keys(job: Int64Array, task: Int64Array) -> Int64Array:
    """One int64 per (job, task), ordered as (job, task) are."""
    if np.any((task < 0) | (task >= 1 << TASK_BITS)):
        raise ValueError("task index out of range")
    return np.asarray(job * (1 << TASK_BITS) + task, dtype=np.int64)


def _forward_fill(values: FloatArray, segment_start: Int64Array) -> FloatArray:
    """Carries each non-NaN value forward, within its segment only (``segment_start`` per element)."""
    index = np.where(np.isnan(values), -1, np.arange(values.size))
    np.maximum.accumulate(index, out=index)
    inside = index >= segment_start
    return np.where(inside, values[np.maximum(index, 0)], np.nan)


def assemble_tasks(windows: TaskWindows, requests: TaskRequests, scale: MachineScale) -> list[TaskSignal]:
    """Each task's merged windows laid out from its first to its last window, with requests as limits.

    A request is in force from its event's window on (an event before the task's first
    window applies from the first); where no request is known (yet), the memory assigned
    to the container stands in for it. Every task of the batch is laid out in one flat
    array per series, which the returned signals view.
    """
    n = len(windows)
    if n == 0:
        return []
    # Tasks in (job, task) order; each row's place in its task's span (no row is moved).
    task_key, task_of_row = np.unique(task_keys(windows.job_id, windows.task_index), return_inverse=True)
    first = np.full(task_key.size, np.iinfo(np.int64).max)
    last = np.full(task_key.size, np.iinfo(np.int64).min)
    np.minimum.at(first, task_of_row, windows.window)
    np.maximum.at(last, task_of_row, windows.window)
    span = last - first + 1
    offset = np.concatenate(([0], np.cumsum(span)[:-1]))
    total = int(span.sum())
    position = offset[task_of_row] + windows.window - first[task_of_row]
    segment_start = np.repeat(offset, span)

    def laid_out(values: FloatArray, unit: float) -> FloatArray:
        out = np.full(total, np.nan)
        out[position] = values * unit
        return out

    memory_request = np.full(total, np.nan)
    cpu_request = np.full(total, np.nan)
    if len(requests):
        request_key = task_keys(requests.job_id, requests.task_index)
        which = np.minimum(np.searchsorted(task_key, request_key), task_key.size - 1)
        at = np.maximum(requests.window - first[which], 0)
        ours = (task_key[which] == request_key) & (at < span[which])
        for values, out in ((requests.memory, memory_request), (requests.cpu, cpu_request)):
            rows = np.flatnonzero(ours & ~np.isnan(values))
            where = offset[which[rows]] + at[rows]
            # Several requests in one window: the last one in trace order holds.
            _, latest = np.unique(where[::-1], return_index=True)
            rows = rows[::-1][latest]
            out[offset[which[rows]] + at[rows]] = values[rows]
        memory_request = _forward_fill(memory_request, segment_start)
        cpu_request = _forward_fill(cpu_request, segment_start)
    assigned = laid_out(windows.assigned_memory, 1.0)
    memory_limit = np.where(np.isnan(memory_request), assigned, memory_request)

    f32 = np.float32
    mm = laid_out(windows.memory_mean, scale.memory_bytes).astype(f32)
    mp = laid_out(windows.memory_peak, scale.memory_bytes).astype(f32)
    cm = laid_out(windows.cpu_mean, scale.cpu_millicores).astype(f32)
    cp = laid_out(windows.cpu_peak, scale.cpu_millicores).astype(f32)
    ml = (memory_limit * scale.memory_bytes).astype(f32)
    cl = (cpu_request * scale.cpu_millicores).astype(f32)
    deciles = None
    if windows.cpu_deciles is not None:
        deciles = np.full((total, CPU_DECILES), np.nan)
        deciles[position] = windows.cpu_deciles * scale.cpu_millicores
        deciles = deciles.astype(f32)
    tasks: list[TaskSignal] = []
    jobs = (task_key >> TASK_BITS).tolist()
    indices = (task_key & ((1 << TASK_BITS) - 1)).tolist()
    for t, (lo, width) in enumerate(zip(offset.tolist(), span.tolist(), strict=True)):
        hi = lo + width
        tasks.append(
            TaskSignal(
                job_id=jobs[t],
                task_index=indices[t],
                first_window=int(first[t]),
                memory_mean=mm[lo:hi],
                memory_peak=mp[lo:hi],
                cpu_mean=cm[lo:hi],
                cpu_peak=cp[lo:hi],
                memory_limit=ml[lo:hi],
                cpu_limit=cl[lo:hi],
                cpu_deciles=None if deciles is None else deciles[lo:hi],
            )
        )
    return tasks


def job_traits(
    trace: str,
    job_id: Int64Array,
    priority: Int64Array,
    scheduling_class: Int64Array,
    requested_tasks: Int64Array,
    task_memory_request: FloatArray,
) -> dict[int, JobTraits]:
    """Traits per job from its events: the highest priority and scheduling class any event
    names (-1: none), how many tasks have a request and the largest memory request (0: none).

    Production priorities and above are serving jobs (Autopilot §4.1.2); scheduling class 3
    is latency-sensitive; the OOM tolerance follows the job's requested memory.
    """
    threshold = PRODUCTION_PRIORITY[trace]
    out: dict[int, JobTraits] = {}
    for job, prio, klass, tasks, per_task in zip(
        job_id.tolist(),
        priority.tolist(),
        scheduling_class.tolist(),
        requested_tasks.tolist(),
        task_memory_request.tolist(),
        strict=True,
    ):
        out[job] = JobTraits(
            job_class=AppClass.LATENCY_SENSITIVE if prio >= threshold else AppClass.BATCH,
            latency=LatencySensitivity.HIGH
            if klass >= LATENCY_SENSITIVE_CLASS
            else LatencySensitivity.MODERATE,
            oom_tolerance=default_oom_tolerance(tasks * per_task),
            priority=prio,
            kind=trace,
        )
    return out
