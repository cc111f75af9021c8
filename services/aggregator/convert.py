"""The aggregator's one meeting place of wire types and core types.

* Kafka ``usage.samples`` records (UsageSampleBatch, CPU and unmet CPU demand in millicores)
  -> the core's :class:`~cellpilot.autopilot.event_windows.SampleChunk` (millicores too);
* closed task windows and job sums -> rows of the history tables (millicores, bytes);
* stored rows -> UsageHistogram / TaskUsageWindow messages of the Monitoring API and of
  Kafka ``usage.histograms``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cellpilot.api.v1 import monitoring_pb2, resources_pb2, usage_pb2
from cellpilot.autopilot.event_windows import (
    ClosedWindows,
    SampleChunk,
    TaskRegistry,
    TaskWindows,
    WindowStats,
)
from cellpilot.autopilot.job_windows import JobWindows
from cellpilot.platform.request_validation import InvalidField
from cellpilot.usage.buckets import (
    CPU_SCHEME,
    MEMORY_SCHEME,
    BucketScheme,
    Resource,
    lookup_scheme,
)
from cellpilot.usage.histogram import SparseHistogram
from cellpilot.usage.windows import WindowBatch

RESOURCE_CODES: dict[Resource, int] = {
    Resource.CPU: resources_pb2.RESOURCE_CPU,
    Resource.MEMORY: resources_pb2.RESOURCE_MEMORY,
}
RESOURCES_BY_CODE = {code: resource for resource, code in RESOURCE_CODES.items()}


@dataclass(frozen=True)
class DecodedBatch:
    machine_id: str
    sequence: int
    chunk: SampleChunk
    invalid: int  # samples dropped for NaN / negative values (usage or unmet demand)


def decode_samples(batch: usage_pb2.UsageSampleBatch, registry: TaskRegistry) -> DecodedBatch:
    """One pass over the samples; malformed samples are dropped."""
    key = registry.key
    rows = [
        (
            key(s.job_id, s.task_index),
            s.event_time_ms,
            s.cpu_millicores,
            s.memory_bytes,
            s.cpu_throttled,
            s.cpu_unmet_millicores,
        )
        for s in batch.samples
    ]
    if not rows:
        empty = SampleChunk(
            np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0), np.zeros(0), np.zeros(0, bool)
        )
        return DecodedBatch(batch.machine_id, batch.batch_sequence, empty, 0)
    task, time_ms, cpu, memory, throttled, unmet = zip(*rows, strict=True)
    cpu_arr = np.asarray(cpu, dtype=np.float64)
    memory_arr = np.asarray(memory, dtype=np.float64)
    unmet_arr = np.asarray(unmet, dtype=np.float64)
    valid = (
        np.isfinite(cpu_arr) & (cpu_arr >= 0) & (memory_arr >= 0) & np.isfinite(unmet_arr) & (unmet_arr >= 0)
    )
    chunk = SampleChunk(
        np.asarray(task, dtype=np.int64),
        np.asarray(time_ms, dtype=np.int64),
        cpu_arr,
        memory_arr,
        np.asarray(throttled, dtype=bool),
        unmet_arr,
    )
    invalid = int(len(rows) - np.count_nonzero(valid))
    if invalid:
        chunk = chunk.select(valid)
    return DecodedBatch(batch.machine_id, batch.batch_sequence, chunk, invalid)


def _sparse_bytes(batch: WindowBatch, row: int) -> bytes:
    lo, hi = int(batch.indptr[row]), int(batch.indptr[row + 1])
    return SparseHistogram(
        batch.scheme, int(batch.start_ms[row]), batch.window_ms, batch.buckets[lo:hi], batch.counts[lo:hi]
    ).to_bytes()


def task_window_rows(closed: ClosedWindows, partition: int) -> list[tuple[Any, ...]]:
    """Rows of ``usage_task_windows`` (column order of :data:`TASK_WINDOW_COLUMNS`)."""
    windows = closed.windows
    stats = windows.stats
    window_ms = windows.window_ms
    memory_buckets = windows.memory_buckets(MEMORY_SCHEME).tolist()
    starts = stats.start_ms.tolist()
    return [
        (
            closed.job_ids[row],
            int(closed.task_index[row]),
            starts[row],
            starts[row] + window_ms,
            partition,
            _sparse_bytes(windows.cpu, row),
            memory_buckets[row],
            int(stats.samples[row]),
            int(stats.throttled[row]),
            float(stats.cpu_sum[row]),
            float(stats.cpu_max[row]),
            float(stats.memory_sum[row]),
            float(stats.memory_max[row]),
            float(stats.cpu_unmet_sum[row]),
        )
        for row in range(len(windows))
    ]


TASK_WINDOW_COLUMNS = (
    "job_id",
    "task_index",
    "window_start_ms",
    "window_end_ms",
    "source_partition",
    "cpu_histogram",
    "memory_bucket",
    "sample_count",
    "throttled_count",
    "cpu_sum_millicores",
    "cpu_max_millicores",
    "memory_sum_bytes",
    "memory_max_bytes",
    "cpu_unmet_sum_millicores",
)
TASK_WINDOW_TYPES = (
    "text",
    "int",
    "bigint",
    "bigint",
    "int",
    "bytea",
    "int",
    "bigint",
    "bigint",
    "float8",
    "float8",
    "float8",
    "float8",
    "float8",
)


def stored_task_windows(rows: Sequence[Any], window_ms: int) -> tuple[TaskWindows, np.ndarray, list[str]]:
    """``usage_task_windows`` rows -> (task windows keyed by task, job key of each task key, job ids)."""
    job_keys: dict[str, int] = {}
    task_keys: dict[tuple[str, int], int] = {}
    job_of_task: list[int] = []
    keys: list[int] = []
    starts: list[int] = []
    sizes: list[int] = [0]
    buckets: list[np.ndarray] = []
    counts: list[np.ndarray] = []
    columns: dict[str, list[float]] = {
        name: [] for name in ("samples", "throttled", "cpu_sum", "cpu_max", "cpu_unmet_sum")
    }
    memory_sum: list[float] = []
    memory_max: list[float] = []
    for row in rows:
        job_id = str(row["job_id"])
        job = job_keys.setdefault(job_id, len(job_keys))
        identity = (job_id, int(row["task_index"]))
        key = task_keys.get(identity)
        if key is None:
            key = task_keys[identity] = len(task_keys)
            job_of_task.append(job)
        sparse = SparseHistogram.from_bytes(bytes(row["cpu_histogram"]))
        keys.append(key)
        starts.append(int(row["window_start_ms"]))
        sizes.append(int(sparse.indices.size))
        buckets.append(sparse.indices)
        counts.append(sparse.counts)
        columns["samples"].append(int(row["sample_count"]))
        columns["throttled"].append(int(row["throttled_count"]))
        columns["cpu_sum"].append(float(row["cpu_sum_millicores"]))
        columns["cpu_max"].append(float(row["cpu_max_millicores"]))
        columns["cpu_unmet_sum"].append(float(row["cpu_unmet_sum_millicores"]))
        memory_sum.append(float(row["memory_sum_bytes"]))
        memory_max.append(float(row["memory_max_bytes"]))
    key_arr = np.asarray(keys, dtype=np.int64)
    start_arr = np.asarray(starts, dtype=np.int64)
    cpu = WindowBatch(
        CPU_SCHEME,
        window_ms,
        key_arr,
        start_arr,
        np.cumsum(sizes).astype(np.int64),
        np.concatenate(buckets).astype(np.int32) if buckets else np.zeros(0, np.int32),
        np.concatenate(counts) if counts else np.zeros(0),
    )
    stats = WindowStats(
        key_arr,
        start_arr,
        np.asarray(columns["samples"], dtype=np.int64),
        np.asarray(columns["cpu_sum"], dtype=np.float64),
        np.asarray(columns["cpu_max"], dtype=np.float64),
        np.asarray(memory_sum, dtype=np.float64),
        np.asarray(memory_max, dtype=np.float64),
        np.asarray(columns["throttled"], dtype=np.int64),
        np.asarray(columns["cpu_unmet_sum"], dtype=np.float64),
    )
    return TaskWindows(cpu, stats), np.asarray(job_of_task, dtype=np.int64), list(job_keys)


def job_histogram_rows(jobs: JobWindows, job_ids: Sequence[str]) -> list[tuple[Any, ...]]:
    """Rows of ``usage_job_histograms`` (column order of :data:`JOB_HISTOGRAM_COLUMNS`), one per
    job window and resource; values in the resource's unit (millicores, bytes) as the windows hold them."""
    rows: list[tuple[Any, ...]] = []
    window_ms = jobs.cpu.window_ms
    for row in range(len(jobs)):
        job_id = job_ids[int(jobs.keys[row])]
        start = int(jobs.start_ms[row])
        common = (int(jobs.samples[row]), int(jobs.task_count[row]))
        # (resource, histograms, peak, mean total, throttled samples, mean total unmet demand)
        signals = (
            (
                Resource.CPU,
                jobs.cpu,
                jobs.cpu_peak,
                jobs.cpu_mean_total,
                jobs.throttled[row],
                jobs.cpu_unmet_mean_total[row],
            ),
            (Resource.MEMORY, jobs.memory, jobs.memory_peak, jobs.memory_mean_total, 0, 0.0),
        )
        for resource, histograms, peak, mean_total, throttled, unmet in signals:
            rows.append(
                (
                    job_id,
                    RESOURCE_CODES[resource],
                    start,
                    start + window_ms,
                    _sparse_bytes(histograms, row),
                    float(peak[row]),
                    float(mean_total[row]),
                    *common,
                    int(throttled),
                    float(unmet),
                )
            )
    return rows


JOB_HISTOGRAM_COLUMNS = (
    "job_id",
    "resource",
    "window_start_ms",
    "window_end_ms",
    "histogram",
    "peak",
    "mean_total_usage",
    "sample_count",
    "task_count",
    "throttled_count",
    "mean_total_unmet",
)
JOB_HISTOGRAM_TYPES = (
    "text",
    "smallint",
    "bigint",
    "bigint",
    "bytea",
    "float8",
    "float8",
    "bigint",
    "int",
    "bigint",
    "float8",
)


def usage_histogram(
    job_id: str,
    resource_code: int,
    histogram: bytes,
    peak: float,
    mean_total: float,
    sample_count: int,
    task_count: int,
    throttled: int,
    task_index: int | None = None,
    mean_total_unmet: float = 0.0,
) -> usage_pb2.UsageHistogram:
    sparse = SparseHistogram.from_bytes(histogram)
    message = usage_pb2.UsageHistogram(
        job_id=job_id,
        resource=resource_code,  # type: ignore[arg-type]
        window_start_ms=sparse.start_ms,
        window_end_ms=sparse.start_ms + sparse.window_ms,
        bucket_scheme_id=sparse.scheme.scheme_id,
        bucket_scheme_version=sparse.scheme.version,
        bucket_indices=sparse.indices.tolist(),
        counts=[round(c) for c in sparse.counts.tolist()],
        peak=peak,
        mean_total_usage=mean_total,
        sample_count=sample_count,
        task_count=task_count,
        throttled_sample_count=throttled,
        mean_total_unmet=mean_total_unmet,
    )
    if task_index is not None:
        message.task_index = task_index
    return message


def job_histogram_message(row: Any) -> usage_pb2.UsageHistogram:
    """A ``usage_job_histograms`` row -> UsageHistogram."""
    return usage_histogram(
        row["job_id"],
        int(row["resource"]),
        bytes(row["histogram"]),
        float(row["peak"]),
        float(row["mean_total_usage"]),
        int(row["sample_count"]),
        int(row["task_count"]),
        int(row["throttled_count"]),
        mean_total_unmet=float(row["mean_total_unmet"]),
    )


def task_histogram_message(rows: Sequence[Any], resource_code: int) -> usage_pb2.UsageHistogram:
    """The rows of one (task, window) (one per source partition) -> UsageHistogram."""
    first = rows[0]
    start, end = int(first["window_start_ms"]), int(first["window_end_ms"])
    samples = sum(int(r["sample_count"]) for r in rows)
    if resource_code == RESOURCE_CODES[Resource.CPU]:
        counts = np.zeros(CPU_SCHEME.size)
        for r in rows:
            sparse = SparseHistogram.from_bytes(bytes(r["cpu_histogram"]))
            counts[sparse.indices] += sparse.counts
        scheme: BucketScheme = CPU_SCHEME
        peak = max(float(r["cpu_max_millicores"]) for r in rows)
        mean = sum(float(r["cpu_sum_millicores"]) for r in rows) / max(samples, 1)
        throttled = sum(int(r["throttled_count"]) for r in rows)
        unmet = sum(float(r["cpu_unmet_sum_millicores"]) for r in rows) / max(samples, 1)
    else:
        counts = np.zeros(MEMORY_SCHEME.size)
        counts[max(int(r["memory_bucket"]) for r in rows)] = 1.0
        scheme = MEMORY_SCHEME
        peak = max(float(r["memory_max_bytes"]) for r in rows)
        mean = sum(float(r["memory_sum_bytes"]) for r in rows) / max(samples, 1)
        throttled, unmet = 0, 0.0
    nonzero = np.flatnonzero(counts).astype(np.int32)
    sparse = SparseHistogram(scheme, start, end - start, nonzero, counts[nonzero])
    return usage_histogram(
        str(first["job_id"]),
        resource_code,
        sparse.to_bytes(),
        peak,
        mean,
        samples,
        1,
        throttled,
        int(first["task_index"]),
        unmet,
    )


def task_usage_window(rows: Sequence[Any]) -> monitoring_pb2.TaskUsageWindow:
    samples = sum(int(r["sample_count"]) for r in rows)
    return monitoring_pb2.TaskUsageWindow(
        window_start_ms=int(rows[0]["window_start_ms"]),
        window_end_ms=int(rows[0]["window_end_ms"]),
        cpu_mean_millicores=sum(float(r["cpu_sum_millicores"]) for r in rows) / max(samples, 1),
        cpu_max_millicores=max(float(r["cpu_max_millicores"]) for r in rows),
        memory_peak_bytes=int(max(float(r["memory_max_bytes"]) for r in rows)),
        sample_count=samples,
        throttled_sample_count=sum(int(r["throttled_count"]) for r in rows),
        cpu_unmet_mean_millicores=sum(float(r["cpu_unmet_sum_millicores"]) for r in rows) / max(samples, 1),
    )


def bucket_scheme_message(scheme_id: str, version: int) -> usage_pb2.BucketScheme:
    """The boundaries (CPU: millicores; memory: bytes); a legacy id answers with the scheme its
    histograms are read as."""
    try:
        scheme = lookup_scheme(scheme_id, version)
    except KeyError as error:
        raise InvalidField("scheme_id", f"unknown bucket scheme {scheme_id!r} version {version}") from error
    return usage_pb2.BucketScheme(
        scheme_id=scheme.scheme_id,
        version=scheme.version,
        resource=RESOURCE_CODES[scheme.resource],  # type: ignore[arg-type]
        upper_bounds=scheme.boundaries.tolist(),
    )


def resource_in(code: int, field: str = "resource") -> Resource:
    resource = RESOURCES_BY_CODE.get(code)
    if resource is None:
        raise InvalidField(field, "must be RESOURCE_CPU or RESOURCE_MEMORY")
    return resource
