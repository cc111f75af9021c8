"""Trace ingest: the columnar (DuckDB) Google 2011 reader against the former row-by-row reader.

A generated ``task_usage`` of 3 000 000 rows at full size (about 12 000 tasks of 2 000 jobs, each task
running for a stretch of up to two days; 2 % of its windows split in two part-window rows,
as when a task restarts) plus a ``task_events`` table (a submit per task, some updates),
written as gzip CSV shards in the 2011 v2.1 column order into a temporary directory. Both
readers turn it into the same per-task signals (checked), each in a fresh process so that
its peak resident memory is its own:

* ``task_usage_rows_per_s``: ``task_usage`` rows per second of the columnar reader
  (``cellpilot.traces.google.read_google2011``, end to end: files to ``TraceTasks``);
* ``speedup_vs_rowwise``: the row-by-row reader's time over the columnar one's, same run;
  the baseline is the former ``csv``-module reader, kept verbatim (and only) in
  ``bench/rowwise_trace_reader.py``;
* ``cpu_speedup_vs_rowwise``: the same ratio in CPU seconds (every thread of the reading
  process): the engine spreads its work over the cores, the baseline uses one, so on a
  busy machine the wall ratio falls towards this one;
* ``peak_rss_mb`` / ``rowwise_peak_rss_mb``: each reading process's peak resident set
  (interpreter and libraries included), ``rowwise_rows_per_s`` the baseline's rate;
* ``parquet_rows_per_s`` / ``parquet_speedup_vs_rowwise``: the columnar reader on the same
  trace converted to Parquet shards (no gzip to inflate, no text to parse), against the
  baseline on gzip CSV.
"""

from __future__ import annotations

import gzip
import multiprocessing
import resource
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from queue import Empty
from typing import Any

import duckdb
import numpy as np

from bench.harness import FULL, SMOKE, Report, sized
from cellpilot.workloads.google_traces import (
    TASK_EVENTS_COLUMNS,
    TASK_USAGE_COLUMNS,
    TRACE_START_US,
    WINDOW_US,
    TraceTasks,
)

FIGURES = [
    "traces.google2011.task_usage_rows_per_s",
    "traces.google2011.speedup_vs_rowwise",
    "traces.google2011.cpu_speedup_vs_rowwise",
    "traces.google2011.peak_rss_mb",
    "traces.google2011.rowwise_rows_per_s",
    "traces.google2011.rowwise_peak_rss_mb",
    "traces.google2011.parquet_rows_per_s",
    "traces.google2011.parquet_speedup_vs_rowwise",
]

SPLIT_SHARE = 0.02


@dataclass(frozen=True)
class Size:
    rows: int  # of task_usage
    jobs: int
    shards: int
    repeats: int  # the columnar readers' best of


SIZES = {
    FULL: Size(rows=3_000_000, jobs=2_000, shards=8, repeats=2),
    SMOKE: Size(rows=20_000, jobs=50, shards=2, repeats=1),
}


def _task_layout(
    rng: np.random.Generator, size: Size
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per task: job id, task index, first window, windows (summing to about ``size.rows``)."""
    tasks_per_job = rng.integers(1, 12, size.jobs)
    job = np.repeat(6_250_000_000 + np.arange(size.jobs) * 7, tasks_per_job)
    index = np.concatenate([np.arange(n) for n in tasks_per_job])
    length = rng.integers(24, 576, job.size)
    length = np.maximum(1, (length * (size.rows * (1 - SPLIT_SHARE / 2)) / length.sum()).astype(np.int64))
    first = rng.integers(0, 8 * 288 - 576, job.size)
    return job, index, first, length


def write_trace(root: Path, size: Size, seed: int = 0) -> int:
    """Writes the trace's shards; returns the number of ``task_usage`` rows."""
    rng = np.random.default_rng(seed)
    job, index, first, length = _task_layout(rng, size)
    task = np.repeat(np.arange(job.size), length)
    window = np.repeat(first, length) + (np.arange(task.size) - np.repeat(np.cumsum(length) - length, length))
    start = TRACE_START_US + window * WINDOW_US
    end = start + WINDOW_US
    split = rng.random(task.size) < SPLIT_SHARE
    middle = start + rng.integers(1, WINDOW_US, task.size)
    start = np.concatenate([start, middle[split]])
    end = np.concatenate([np.where(split, middle, end), end[split]])
    task = np.concatenate([task, task[split]])
    n = task.size
    level = rng.lognormal(-4.0, 1.0, job.size)[task]
    memory = np.round(level * rng.uniform(0.8, 1.2, n), 6)
    cpu = np.round(level * rng.uniform(0.2, 1.5, n), 6)
    columns: dict[str, Any] = {
        "start_time": start,
        "end_time": end,
        "job_id": job[task],
        "task_index": index[task],
        "machine_id": 4_000_000 + task % 12_000,
        "cpu_rate": cpu,
        "canonical_memory_usage": memory,
        "assigned_memory_usage": np.round(memory * 1.3, 6),
        "unmapped_page_cache": np.round(memory * 0.01, 6),
        "total_page_cache": np.round(memory * 0.02, 6),
        "maximum_memory_usage": np.round(memory * 1.1, 6),
        "disk_io_time": np.round(cpu * 0.001, 6),
        "local_disk_space_usage": np.round(memory * 0.001, 6),
        "maximum_cpu_rate": np.round(cpu * 2.0, 6),
        "maximum_disk_io_time": np.round(cpu * 0.002, 6),
        "cycles_per_instruction": np.round(rng.uniform(0.5, 3.0, n), 4),
        "memory_accesses_per_instruction": np.round(rng.uniform(0.001, 0.01, n), 6),
        "sample_portion": np.ones(n),
        "aggregation_type": np.zeros(n, dtype=np.int64),
        "sampled_cpu_usage": np.round(cpu * 1.1, 6),
    }
    assert tuple(columns) == TASK_USAGE_COLUMNS
    order = np.argsort(start, kind="stable")  # the public trace's part files follow time
    usage = {name: values[order] for name, values in columns.items()}
    tasks = job.size
    submit = TRACE_START_US + first * WINDOW_US - 1_000_000
    updates = rng.random(tasks) < 0.3
    at = np.concatenate([submit, submit[updates] + length[updates] // 2 * WINDOW_US])
    who = np.concatenate([np.arange(tasks), np.arange(tasks)[updates]])
    request = rng.lognormal(-4.0, 1.0, job.size)[who]
    events: dict[str, Any] = {
        "timestamp": at,
        "missing_info": np.zeros(at.size, dtype=np.int64),
        "job_id": job[who],
        "task_index": index[who],
        "machine_id": np.zeros(at.size, dtype=np.int64),
        "event_type": np.where(np.arange(at.size) < tasks, 0, 8),
        "user": np.full(at.size, "user"),
        "scheduling_class": rng.integers(0, 4, size.jobs)[(job[who] - 6_250_000_000) // 7],
        "priority": rng.integers(0, 12, size.jobs)[(job[who] - 6_250_000_000) // 7],
        "cpu_request": np.round(request * 2.0, 6),
        "memory_request": np.round(request * 1.5, 6),
        "disk_space_request": np.zeros(at.size),
        "different_machines_restriction": np.zeros(at.size, dtype=np.int64),
    }
    assert tuple(events) == TASK_EVENTS_COLUMNS
    for table, data, shards in (("task_usage", usage, size.shards), ("task_events", events, 1)):
        folder = root / table
        folder.mkdir(parents=True)
        rows = len(next(iter(data.values())))
        bounds = np.linspace(0, rows, shards + 1).astype(np.int64)
        for s in range(shards):
            part = {name: values[bounds[s] : bounds[s + 1]] for name, values in data.items()}
            plain = folder / f"part-{s:05d}-of-{shards:05d}.csv"
            con = duckdb.connect()
            con.execute("SET enable_progress_bar = false")
            con.register("part", part)
            con.execute(f"COPY part TO '{plain}' (FORMAT csv, HEADER false)")
            con.close()
            with plain.open("rb") as source, gzip.open(f"{plain}.gz", "wb", compresslevel=1) as target:
                shutil.copyfileobj(source, target, 1 << 20)
            plain.unlink()
    return int(n)


def _peak_rss_kb() -> float:
    """This process's peak resident set (VmHWM: unlike ``ru_maxrss`` it does not carry the
    parent's peak over an exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return float(line.split()[1])
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # every thread of this process
    return usage.ru_utime + usage.ru_stime


@dataclass(frozen=True)
class Reading:
    seconds: float
    cpu_seconds: float
    peak_mb: float
    digest: tuple[Any, ...]


def _read(reader: str, root: str, queue: Any) -> None:
    """In a fresh process: read the trace; report wall and CPU seconds, peak RSS and a digest."""
    read: Callable[[str], TraceTasks]
    if reader == "columnar":  # only the measured reader's modules are imported
        from cellpilot.traces.google import read_google2011

        read = read_google2011
    else:
        from bench.rowwise_trace_reader import read_google2011_rowwise

        read = read_google2011_rowwise
    started, cpu = time.perf_counter(), _cpu_seconds()
    trace = read(root)
    seconds, cpu = time.perf_counter() - started, _cpu_seconds() - cpu
    digest = (
        len(trace.tasks),
        trace.windows,
        float(sum(np.nansum(t.memory_mean, dtype=np.float64) for t in trace.tasks)),
        float(sum(np.nansum(t.memory_limit, dtype=np.float64) for t in trace.tasks)),
        len(trace.traits),
    )
    queue.put(Reading(seconds, cpu, _peak_rss_kb() / 1024.0, digest))


def _measure(reader: str, root: Path, repeats: int = 1) -> Reading:
    """The fastest of ``repeats`` readings, each in a fresh process."""
    context = multiprocessing.get_context("spawn")
    readings = []
    for _ in range(repeats):
        queue = context.Queue()
        process = context.Process(target=_read, args=(reader, str(root), queue))
        process.start()
        try:
            while True:
                try:
                    readings.append(queue.get(timeout=1.0))
                    break
                except Empty:
                    if not process.is_alive():  # died without a reading: say so, never wait forever
                        raise RuntimeError(f"the {reader} reader exited with {process.exitcode}") from None
            process.join()
        finally:
            if process.is_alive():
                process.kill()
                process.join()
    return min(readings, key=lambda r: r.seconds)


def _to_parquet(source: Path, target: Path) -> None:
    """The same trace as Parquet shards (named columns, as a converted trace has)."""
    for table, names in (("task_usage", TASK_USAGE_COLUMNS), ("task_events", TASK_EVENTS_COLUMNS)):
        (target / table).mkdir(parents=True)
        for shard in sorted((source / table).iterdir()):
            con = duckdb.connect()
            con.execute("SET enable_progress_bar = false")
            relation = con.read_csv(str(shard), header=False, names=list(names))
            relation.write_parquet(str(target / table / (shard.name.split(".")[0] + ".parquet")))
            con.close()


def run(report: Report, size: str = FULL) -> None:
    params = sized(SIZES, size)
    with tempfile.TemporaryDirectory(prefix="cellpilot-bench-traces-") as folder:
        root = Path(folder) / "csv"
        rows = write_trace(root, params)
        mib = sum(p.stat().st_size for p in root.rglob("*.gz")) / 2**20
        print(
            f"generated task_usage: {rows} rows in {params.shards} gzip CSV shards "
            f"({mib:.0f} MiB with events)"
        )
        columnar = _measure("columnar", root, repeats=params.repeats)
        rowwise = _measure("rowwise", root)
        _to_parquet(root, Path(folder) / "parquet")
        parquet = _measure("columnar", Path(folder) / "parquet", repeats=params.repeats)
    if not columnar.digest == rowwise.digest == parquet.digest:
        raise AssertionError(f"the readers disagree: {columnar.digest}, {rowwise.digest}, {parquet.digest}")
    report("traces.google2011.task_usage_rows_per_s", rows / columnar.seconds, "rows/s")
    report("traces.google2011.speedup_vs_rowwise", rowwise.seconds / columnar.seconds, "x")
    report("traces.google2011.cpu_speedup_vs_rowwise", rowwise.cpu_seconds / columnar.cpu_seconds, "x")
    report("traces.google2011.peak_rss_mb", columnar.peak_mb, "MB")
    report("traces.google2011.rowwise_rows_per_s", rows / rowwise.seconds, "rows/s")
    report("traces.google2011.rowwise_peak_rss_mb", rowwise.peak_mb, "MB")
    report("traces.google2011.parquet_rows_per_s", rows / parquet.seconds, "rows/s")
    report("traces.google2011.parquet_speedup_vs_rowwise", rowwise.seconds / parquet.seconds, "x")
    print(
        f"gzip CSV: columnar {columnar.seconds:.2f} s ({columnar.cpu_seconds:.1f} CPU s), peak "
        f"{columnar.peak_mb:.0f} MB; row by row {rowwise.seconds:.2f} s ({rowwise.cpu_seconds:.1f} CPU s), "
        f"peak {rowwise.peak_mb:.0f} MB. Parquet: columnar {parquet.seconds:.2f} s "
        f"({parquet.cpu_seconds:.1f} CPU s). All read {columnar.digest[0]} tasks of "
        f"{columnar.digest[4]} jobs."
    )
