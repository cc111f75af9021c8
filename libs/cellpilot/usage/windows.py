"""Batch builders: many per-task and per-job window histograms at once from raw samples.

Raw samples are parallel arrays (task id, event time in ms, value): the raw signal
r_i[tau] of Autopilot §3.2.1, typically one sample per task per second. A window is
[origin + w * window_ms, origin + (w + 1) * window_ms). The result is a
:class:`WindowBatch`: one row per (key, window) that has samples, with the histograms
stored sparsely (CSR: ``indptr``, ``buckets``, ``counts``) so that a day of a large cell
does not need ~400 dense floats per task-window.

The two signal rules of §3.2.1:

* ``SignalKind.DISTRIBUTION`` (CPU): every sample counts in its bucket;
* ``SignalKind.PEAK`` (memory): only the task's peak in the window is recorded, so a task
  histogram has exactly one non-zero bucket with count 1.

A per-job histogram is the sum of its tasks' histograms (:func:`sum_by_group`). Because
samples of one window may arrive in several chunks (a Borglet publishes every few
seconds), :func:`merge_partial_windows` combines rows of the same (task, window) built
from different chunks: counts add for CPU, the higher peak wins for memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import numpy.typing as npt

from cellpilot.array_types import FloatArray, Int32Array, Int64Array
from cellpilot.usage.buckets import BucketScheme, Resource
from cellpilot.usage.histogram import DEFAULT_WINDOW_MS, Histogram


class SignalKind(StrEnum):
    DISTRIBUTION = "distribution"  # CPU: count every raw sample
    PEAK = "peak"  # memory: record only the window's peak


def signal_kind(resource: Resource) -> SignalKind:
    """§3.2.1: CPU histograms count every sample, memory histograms hold the window peak."""
    return SignalKind.DISTRIBUTION if resource is Resource.CPU else SignalKind.PEAK


@dataclass(frozen=True, eq=False)
class WindowBatch:
    """Histograms of many (key, window) pairs, rows sorted by (key, start_ms).

    Row i's non-zero buckets are ``buckets[indptr[i]:indptr[i+1]]`` (increasing) with
    ``counts`` alongside. ``keys`` are task ids for task windows, job ids for job windows.
    """

    scheme: BucketScheme
    window_ms: int
    keys: Int64Array
    start_ms: Int64Array
    indptr: Int64Array
    buckets: Int32Array
    counts: FloatArray

    def __post_init__(self) -> None:
        if self.window_ms <= 0:
            raise ValueError("window_ms must be positive")
        rows = self.keys.shape[0]
        if self.start_ms.shape != (rows,) or self.indptr.shape != (rows + 1,):
            raise ValueError("keys, start_ms and indptr disagree on the number of rows")
        if self.buckets.shape != self.counts.shape or self.indptr[-1] != self.buckets.shape[0]:
            raise ValueError("indptr does not match the number of stored buckets")

    def __len__(self) -> int:
        return int(self.keys.shape[0])

    @property
    def end_ms(self) -> Int64Array:
        return self.start_ms + self.window_ms

    def entry_rows(self) -> Int64Array:
        """Row index of every stored (bucket, count) entry."""
        return np.repeat(np.arange(len(self), dtype=np.int64), np.diff(self.indptr))

    def dense(self) -> FloatArray:
        """``(rows, K)`` count matrix, the recommenders' batch input."""
        out = np.zeros((len(self), self.scheme.size))
        out[self.entry_rows(), self.buckets] = self.counts
        return out

    def histogram(self, row: int) -> Histogram:
        lo, hi = int(self.indptr[row]), int(self.indptr[row + 1])
        counts = np.zeros(self.scheme.size)
        counts[self.buckets[lo:hi]] = self.counts[lo:hi]
        return Histogram(self.scheme, int(self.start_ms[row]), self.window_ms, counts)

    def select(self, mask: npt.NDArray[np.bool_]) -> WindowBatch:
        """The rows where ``mask`` is true (order kept)."""
        mask = np.asarray(mask, dtype=bool)
        if mask.shape != (len(self),):
            raise ValueError("mask must have one entry per row")
        entry_keep = np.repeat(mask, np.diff(self.indptr))
        sizes = np.diff(self.indptr)[mask]
        return WindowBatch(
            self.scheme,
            self.window_ms,
            self.keys[mask],
            self.start_ms[mask],
            np.concatenate(([0], np.cumsum(sizes))).astype(np.int64),
            self.buckets[entry_keep],
            self.counts[entry_keep],
        )

    def split_closed(self, watermark_ms: int) -> tuple[WindowBatch, WindowBatch]:
        """(rows whose window ended at or before ``watermark_ms``, the still-open rest)."""
        closed = self.end_ms <= watermark_ms
        return self.select(closed), self.select(~closed)


def group_runs(*columns: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """Sort order of the rows of ``columns`` (lexicographic, first column most significant)
    and the start positions (in sorted order) of each run of equal rows."""
    order = np.lexsort(columns[::-1])
    n = order.size
    if n == 0:
        return order, np.zeros(0, dtype=np.intp)
    change = np.zeros(n, dtype=bool)
    change[0] = True
    for column in columns:
        ordered = column[order]
        change[1:] |= ordered[1:] != ordered[:-1]
    return order, np.flatnonzero(change)


def _from_entries(
    scheme: BucketScheme,
    window_ms: int,
    keys: Int64Array,
    starts: Int64Array,
    buckets: npt.NDArray[np.int64],
    counts: FloatArray,
) -> WindowBatch:
    """Canonical batch from unsorted (key, start, bucket, count) entries; duplicates add up."""
    order, heads = group_runs(keys, starts, buckets)
    summed = np.add.reduceat(counts[order], heads) if heads.size else np.zeros(0)
    k, s, b = keys[order][heads], starts[order][heads], buckets[order][heads]
    keep = summed > 0.0
    k, s, b, summed = k[keep], s[keep], b[keep], summed[keep]
    if k.size == 0:
        return _empty(scheme, window_ms)
    row_change = np.ones(k.size, dtype=bool)
    row_change[1:] = (k[1:] != k[:-1]) | (s[1:] != s[:-1])
    row_heads = np.flatnonzero(row_change)
    indptr = np.concatenate((row_heads, [k.size])).astype(np.int64)
    return WindowBatch(
        scheme,
        window_ms,
        k[row_heads].astype(np.int64),
        s[row_heads].astype(np.int64),
        indptr,
        b.astype(np.int32),
        summed.astype(np.float64),
    )


def _empty(scheme: BucketScheme, window_ms: int) -> WindowBatch:
    return WindowBatch(
        scheme,
        window_ms,
        np.zeros(0, dtype=np.int64),
        np.zeros(0, dtype=np.int64),
        np.zeros(1, dtype=np.int64),
        np.zeros(0, dtype=np.int32),
        np.zeros(0, dtype=np.float64),
    )


def window_starts(time_ms: npt.ArrayLike, window_ms: int, origin_ms: int = 0) -> Int64Array:
    """Start of the window holding each event time: origin + floor((t - origin) / window) * window."""
    t = np.asarray(time_ms, dtype=np.int64)
    return np.asarray(origin_ms + ((t - origin_ms) // window_ms) * window_ms, dtype=np.int64)


def build_task_windows(
    scheme: BucketScheme,
    task_ids: npt.ArrayLike,
    time_ms: npt.ArrayLike,
    values: npt.ArrayLike,
    *,
    kind: SignalKind | None = None,
    window_ms: int = DEFAULT_WINDOW_MS,
    origin_ms: int = 0,
) -> WindowBatch:
    """Per-task window histograms s_i[t] from raw samples (§3.2.1), all windows at once.

    ``kind`` defaults to the scheme's resource rule (CPU: every sample; memory: the peak).
    """
    tasks = np.asarray(task_ids, dtype=np.int64)
    times = np.asarray(time_ms, dtype=np.int64)
    vals = np.asarray(values, dtype=np.float64)
    if not tasks.shape == times.shape == vals.shape or tasks.ndim != 1:
        raise ValueError("task_ids, time_ms and values must be 1-d arrays of the same length")
    if window_ms <= 0:
        raise ValueError("window_ms must be positive")
    kind = kind or signal_kind(scheme.resource)
    if tasks.size == 0:
        return _empty(scheme, window_ms)
    starts = window_starts(times, window_ms, origin_ms)
    if kind is SignalKind.DISTRIBUTION:
        buckets = scheme.index_of(vals).astype(np.int64)
        return _from_entries(scheme, window_ms, tasks, starts, buckets, np.ones(tasks.size))
    # PEAK: reduce each (task, window) to its maximum value first, then one count there.
    order, heads = group_runs(tasks, starts)
    peaks = np.maximum.reduceat(vals[order], heads)
    buckets = scheme.index_of(peaks).astype(np.int64)
    return _from_entries(
        scheme, window_ms, tasks[order][heads], starts[order][heads], buckets, np.ones(heads.size)
    )


def sum_by_group(batch: WindowBatch, group_of_row: npt.ArrayLike) -> WindowBatch:
    """Per-group sums of same-window rows: the per-job s[t][k] = sum_i s_i[t][k] (§3.2.1).

    ``group_of_row[i]`` is the group (job id) of row i; the result's keys are group ids.
    """
    groups = np.asarray(group_of_row, dtype=np.int64)
    if groups.shape != (len(batch),):
        raise ValueError("group_of_row must have one entry per row")
    rows = batch.entry_rows()
    return _from_entries(
        batch.scheme,
        batch.window_ms,
        groups[rows],
        batch.start_ms[rows],
        batch.buckets.astype(np.int64),
        batch.counts,
    )


def build_job_windows(
    scheme: BucketScheme,
    job_ids: npt.ArrayLike,
    task_ids: npt.ArrayLike,
    time_ms: npt.ArrayLike,
    values: npt.ArrayLike,
    *,
    kind: SignalKind | None = None,
    window_ms: int = DEFAULT_WINDOW_MS,
    origin_ms: int = 0,
) -> tuple[WindowBatch, WindowBatch]:
    """(task windows, job windows) from raw samples that carry their job id.

    Task ids must be unique across jobs (one task belongs to one job).
    """
    jobs = np.asarray(job_ids, dtype=np.int64)
    tasks = np.asarray(task_ids, dtype=np.int64)
    task_batch = build_task_windows(
        scheme, tasks, time_ms, values, kind=kind, window_ms=window_ms, origin_ms=origin_ms
    )
    if tasks.size == 0:
        return task_batch, task_batch
    order, heads = group_runs(tasks, jobs)
    unique_tasks = tasks[order][heads]
    if np.any(unique_tasks[1:] == unique_tasks[:-1]):
        raise ValueError("a task id appears under more than one job id")
    job_of_task = jobs[order][heads]
    group = job_of_task[np.searchsorted(unique_tasks, task_batch.keys)]
    return task_batch, sum_by_group(task_batch, group)


def concat_windows(batches: Sequence[WindowBatch]) -> WindowBatch:
    """Rows of all batches, in order (no merging: see :func:`merge_partial_windows`)."""
    if not batches:
        raise ValueError("need at least one batch")
    first = batches[0]
    if any(b.scheme != first.scheme or b.window_ms != first.window_ms for b in batches):
        raise ValueError("batches must share scheme and window length")
    offsets = np.cumsum([0] + [b.indptr[-1] for b in batches[:-1]])
    indptr = np.concatenate([[0]] + [b.indptr[1:] + off for b, off in zip(batches, offsets, strict=True)])
    return WindowBatch(
        first.scheme,
        first.window_ms,
        np.concatenate([b.keys for b in batches]),
        np.concatenate([b.start_ms for b in batches]),
        indptr.astype(np.int64),
        np.concatenate([b.buckets for b in batches]),
        np.concatenate([b.counts for b in batches]),
    )


def merge_partial_windows(batch: WindowBatch, kind: SignalKind | None = None) -> WindowBatch:
    """Combine rows of the same (key, window) built from different sample chunks.

    DISTRIBUTION rows add up; PEAK rows keep only the highest bucket (count 1), which is
    the histogram of the peak over the union of the chunks.
    """
    kind = kind or signal_kind(batch.scheme.resource)
    rows = batch.entry_rows()
    keys, starts = batch.keys[rows], batch.start_ms[rows]
    buckets = batch.buckets.astype(np.int64)
    if kind is SignalKind.DISTRIBUTION:
        return _from_entries(batch.scheme, batch.window_ms, keys, starts, buckets, batch.counts)
    if buckets.size == 0:
        return _empty(batch.scheme, batch.window_ms)
    order, heads = group_runs(keys, starts)
    top = np.maximum.reduceat(buckets[order], heads)
    return _from_entries(
        batch.scheme, batch.window_ms, keys[order][heads], starts[order][heads], top, np.ones(heads.size)
    )
