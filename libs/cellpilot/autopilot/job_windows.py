"""Per-job window histograms s[t] from closed per-task windows s_i[t] (Autopilot §3.2.1).

s[t][k] = sum_i s_i[t][k]: CPU histograms add; a memory job histogram counts each task's
window peak once. The task windows of one job may come from several input partitions (the
job's tasks run on machines whose samples land in different partitions), and, when a task
moved machine within a window, one task may have several rows: these are combined first
(counts and sums add, peaks take the maximum), so a task always counts once.

Alongside the histograms, the per-window summaries the wire format carries: raw sample
and throttled-sample counts, tasks reporting, the peak raw sample, and the mean over the
window of the summed usage of the job's tasks (sum over tasks of each task's mean), the
input of horizontal autoscaling's r_S (§3.3), and likewise of their unmet CPU demand (what
their machines did not serve, Borg §6.2).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cellpilot.array_types import FloatArray, Int64Array
from cellpilot.autopilot.event_windows import TaskWindows, WindowStats
from cellpilot.usage.buckets import MEMORY_SCHEME, BucketScheme
from cellpilot.usage.windows import SignalKind, WindowBatch, group_runs, merge_partial_windows, sum_by_group


@dataclass(frozen=True, eq=False)
class JobWindows:
    """One row per (job, window), sorted by (job key, start); histogram rows aligned."""

    keys: Int64Array
    start_ms: Int64Array
    cpu: WindowBatch
    memory: WindowBatch
    samples: Int64Array
    throttled: Int64Array
    task_count: Int64Array
    cpu_peak: FloatArray
    cpu_mean_total: FloatArray
    memory_peak: FloatArray
    memory_mean_total: FloatArray
    cpu_unmet_mean_total: FloatArray  # like cpu_mean_total, of the unmet CPU demand (millicores)

    def __len__(self) -> int:
        return int(self.keys.shape[0])


def combine_task_rows(windows: TaskWindows) -> TaskWindows:
    """Merge rows that describe the same (task, window) (e.g. from two partitions)."""
    cpu = merge_partial_windows(windows.cpu, SignalKind.DISTRIBUTION)
    stats = windows.stats
    stats = WindowStats.reduce_rows(
        stats.keys,
        stats.start_ms,
        {
            "samples": stats.samples,
            "cpu_sum": stats.cpu_sum,
            "cpu_max": stats.cpu_max,
            "memory_sum": stats.memory_sum,
            "memory_max": stats.memory_max,
            "throttled": stats.throttled,
            "cpu_unmet_sum": stats.cpu_unmet_sum,
        },
    )
    return TaskWindows(cpu, stats)


def sum_jobs(
    windows: TaskWindows, job_of_task: npt.ArrayLike, memory_scheme: BucketScheme = MEMORY_SCHEME
) -> JobWindows:
    """Per-job sums of task windows; ``job_of_task[key]`` is the job key of task ``key``."""
    job_of = np.asarray(job_of_task, dtype=np.int64)
    tasks = combine_task_rows(windows)
    stats = tasks.stats
    jobs_of_rows = job_of[stats.keys] if len(stats) else np.zeros(0, dtype=np.int64)
    cpu = sum_by_group(tasks.cpu, jobs_of_rows)
    memory_rows = WindowBatch(
        memory_scheme,
        tasks.window_ms,
        stats.keys,
        stats.start_ms,
        np.arange(len(stats) + 1, dtype=np.int64),
        memory_scheme.index_of(stats.memory_max).astype(np.int32),
        np.ones(len(stats)),
    )
    memory = sum_by_group(memory_rows, jobs_of_rows)
    order, heads = group_runs(jobs_of_rows, stats.start_ms)
    with np.errstate(invalid="ignore", divide="ignore"):
        cpu_mean = np.where(stats.samples > 0, stats.cpu_sum / stats.samples, 0.0)
        memory_mean = np.where(stats.samples > 0, stats.memory_sum / stats.samples, 0.0)
        unmet_mean = np.where(stats.samples > 0, stats.cpu_unmet_sum / stats.samples, 0.0)

    def add(values: npt.NDArray[np.generic]) -> npt.NDArray[np.generic]:
        return np.add.reduceat(values[order], heads) if heads.size else values[:0]

    def peak(values: FloatArray) -> FloatArray:
        return np.maximum.reduceat(values[order], heads) if heads.size else values[:0]

    result = JobWindows(
        keys=jobs_of_rows[order][heads],
        start_ms=stats.start_ms[order][heads],
        cpu=cpu,
        memory=memory,
        samples=np.asarray(add(stats.samples), dtype=np.int64),
        throttled=np.asarray(add(stats.throttled), dtype=np.int64),
        task_count=np.asarray(add(np.ones(len(stats), dtype=np.int64)), dtype=np.int64),
        cpu_peak=peak(stats.cpu_max),
        cpu_mean_total=np.asarray(add(cpu_mean), dtype=np.float64),
        memory_peak=peak(stats.memory_max),
        memory_mean_total=np.asarray(add(memory_mean), dtype=np.float64),
        cpu_unmet_mean_total=np.asarray(add(unmet_mean), dtype=np.float64),
    )
    if not (
        np.array_equal(result.cpu.keys, result.keys)
        and np.array_equal(result.memory.keys, result.keys)
        and np.array_equal(result.cpu.start_ms, result.start_ms)
    ):
        raise AssertionError("job histograms and summaries disagree on their rows")
    return result
