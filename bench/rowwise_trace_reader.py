"""BASELINE ONLY: the row-by-row trace readers Cellpilot used before its columnar engine.

A verbatim copy of the ``csv``/``json`` readers that ``cellpilot.traces`` replaced, kept
here, and only here, as the baseline of ``bench/bench_traces.py`` (rows per second and
peak memory in the same run) and as the reference the reader-equivalence tests compare
against. Nothing in ``libs/`` or ``services/`` imports it; do not use it for anything else.
"""

from __future__ import annotations

import csv
import gzip
import json
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from cellpilot.job_vocabulary import AppClass, LatencySensitivity
from cellpilot.lifetimes.vm_table import VmTrace
from cellpilot.recommend.policy import default_oom_tolerance
from cellpilot.workloads.google_traces import (
    PRODUCTION_PRIORITY,
    TRACE_START_US,
    WINDOW_US,
    EventRows,
    MachineScale,
    TraceTasks,
    UsageRows,
)
from cellpilot.workloads.task_signals import CPU_DECILES, JobTraits, TaskSignal

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
LATENCY_SENSITIVE_CLASS = 3
_TASK_BITS = 20

# ---------------------------------------------------------------- Google 2011 / 2019 (row by row)


def _float(text: str) -> float:
    return float(text) if text.strip() else float("nan")


def _int(text: str) -> int:
    return int(float(text)) if text.strip() else -1


def parse_google2011_task_usage_rowwise(lines: Iterable[str]) -> UsageRows:
    """Rows of ``task_usage`` part files; rows without a job, task or times are skipped."""
    cols: dict[str, list[float]] = {k: [] for k in ("s", "e", "j", "t", "mm", "mp", "cm", "cp", "cs", "am")}
    for row in csv.reader(line for line in lines if line.strip()):
        if len(row) < 14 or not (row[0] and row[1] and row[2] and row[3]):
            continue
        cols["am"].append(_float(row[7]))
        cols["s"].append(int(row[0]))
        cols["e"].append(int(row[1]))
        cols["j"].append(int(row[2]))
        cols["t"].append(int(row[3]))
        cols["cm"].append(_float(row[5]))
        cols["mm"].append(_float(row[6]))
        cols["mp"].append(_float(row[10]))
        cols["cp"].append(_float(row[13]))
        cols["cs"].append(_float(row[19]) if len(row) > 19 else float("nan"))
    return UsageRows(
        start_us=np.asarray(cols["s"], dtype=np.int64),
        end_us=np.asarray(cols["e"], dtype=np.int64),
        job_id=np.asarray(cols["j"], dtype=np.int64),
        task_index=np.asarray(cols["t"], dtype=np.int64),
        memory_mean=np.asarray(cols["mm"], dtype=np.float64),
        memory_peak=np.asarray(cols["mp"], dtype=np.float64),
        cpu_mean=np.asarray(cols["cm"], dtype=np.float64),
        cpu_peak=np.asarray(cols["cp"], dtype=np.float64),
        cpu_sample=np.asarray(cols["cs"], dtype=np.float64),
        assigned_memory=np.asarray(cols["am"], dtype=np.float64),
    )


def parse_google2011_task_events_rowwise(lines: Iterable[str]) -> EventRows:
    """Rows of ``task_events`` part files."""
    cols: dict[str, list[float]] = {k: [] for k in ("time", "j", "t", "p", "c", "cpu", "mem")}
    for row in csv.reader(line for line in lines if line.strip()):
        if len(row) < 11 or not (row[0] and row[2] and row[3]):
            continue
        cols["time"].append(int(row[0]))
        cols["j"].append(int(row[2]))
        cols["t"].append(int(row[3]))
        cols["c"].append(_int(row[7]))
        cols["p"].append(_int(row[8]))
        cols["cpu"].append(_float(row[9]))
        cols["mem"].append(_float(row[10]))
    return _events(cols)


def _events(cols: dict[str, list[float]]) -> EventRows:
    return EventRows(
        time_us=np.asarray(cols["time"], dtype=np.int64),
        job_id=np.asarray(cols["j"], dtype=np.int64),
        task_index=np.asarray(cols["t"], dtype=np.int64),
        priority=np.asarray(cols["p"], dtype=np.int64),
        scheduling_class=np.asarray(cols["c"], dtype=np.int64),
        cpu_request=np.asarray(cols["cpu"], dtype=np.float64),
        memory_request=np.asarray(cols["mem"], dtype=np.float64),
    )


def _field(record: dict[str, Any], *path: str) -> Any:
    """A nested JSON field (``average_usage.cpus``), or the flattened ``average_usage_cpus``."""
    value: Any = record
    for key in path:
        if not isinstance(value, dict) or key not in value:
            flat = record.get("_".join(path), record.get(".".join(path)))
            return flat
        value = value[key]
    return value


def _number(value: Any) -> float:
    return float("nan") if value is None or value == "" else float(value)


def parse_google2019_instance_usage_rowwise(lines: Iterable[str]) -> UsageRows:
    """NDJSON rows of ``instance_usage``; alloc-set rows (collection_type 1) are skipped."""
    cols: dict[str, list[float]] = {k: [] for k in ("s", "e", "j", "t", "mm", "mp", "cm", "cp", "cs", "am")}
    deciles: list[list[float]] = []
    for line in lines:
        if not line.strip():
            continue
        record = json.loads(line)
        if int(_number(record.get("collection_type", 0)) or 0) == 1:
            continue
        try:
            start, end = int(record["start_time"]), int(record["end_time"])
            job, task = int(record["collection_id"]), int(record["instance_index"])
        except (KeyError, TypeError, ValueError):
            continue
        cols["s"].append(start)
        cols["e"].append(end)
        cols["j"].append(job)
        cols["t"].append(task)
        cols["mm"].append(_number(_field(record, "average_usage", "memory")))
        cols["mp"].append(_number(_field(record, "maximum_usage", "memory")))
        cols["cm"].append(_number(_field(record, "average_usage", "cpus")))
        cols["cp"].append(_number(_field(record, "maximum_usage", "cpus")))
        cols["cs"].append(_number(_field(record, "random_sample_usage", "cpus")))
        cols["am"].append(_number(record.get("assigned_memory")))
        dist = record.get("cpu_usage_distribution") or []
        deciles.append([float(v) for v in dist] if len(dist) == CPU_DECILES else [float("nan")] * CPU_DECILES)
    return UsageRows(
        start_us=np.asarray(cols["s"], dtype=np.int64),
        end_us=np.asarray(cols["e"], dtype=np.int64),
        job_id=np.asarray(cols["j"], dtype=np.int64),
        task_index=np.asarray(cols["t"], dtype=np.int64),
        memory_mean=np.asarray(cols["mm"], dtype=np.float64),
        memory_peak=np.asarray(cols["mp"], dtype=np.float64),
        cpu_mean=np.asarray(cols["cm"], dtype=np.float64),
        cpu_peak=np.asarray(cols["cp"], dtype=np.float64),
        cpu_sample=np.asarray(cols["cs"], dtype=np.float64),
        assigned_memory=np.asarray(cols["am"], dtype=np.float64),
        cpu_deciles=np.asarray(deciles, dtype=np.float64).reshape(-1, CPU_DECILES),
    )


def parse_google2019_instance_events_rowwise(lines: Iterable[str]) -> EventRows:
    """NDJSON rows of ``instance_events`` (only rows naming a job instance are kept)."""
    cols: dict[str, list[float]] = {k: [] for k in ("time", "j", "t", "p", "c", "cpu", "mem")}
    for line in lines:
        if not line.strip():
            continue
        record = json.loads(line)
        if int(_number(record.get("collection_type", 0)) or 0) == 1:
            continue
        try:
            time_us, job, task = (
                int(record["time"]),
                int(record["collection_id"]),
                int(record["instance_index"]),
            )
        except (KeyError, TypeError, ValueError):
            continue
        cols["time"].append(time_us)
        cols["j"].append(job)
        cols["t"].append(task)
        priority, klass = record.get("priority"), record.get("scheduling_class")
        cols["p"].append(int(_number(priority)) if priority is not None else -1)
        cols["c"].append(int(_number(klass)) if klass is not None else -1)
        cols["cpu"].append(_number(_field(record, "resource_request", "cpus")))
        cols["mem"].append(_number(_field(record, "resource_request", "memory")))
    return _events(cols)


def _key(job: IntArray, task: IntArray) -> IntArray:
    if np.any((task < 0) | (task >= 1 << _TASK_BITS)):
        raise ValueError("task index out of range")
    return np.asarray(job * (1 << _TASK_BITS) + task, dtype=np.int64)


def build_tasks_rowwise(usage: UsageRows, events: EventRows, scale: MachineScale, trace: str) -> TraceTasks:
    """Merge usage rows into per-task 5-minute series on a common grid, with requests as limits.

    Where no request is known (yet), the memory assigned to the container stands in for it.
    """
    if len(usage) == 0:
        return TraceTasks([], {}, 0, TRACE_START_US)
    keep = ~np.isnan(usage.memory_mean)
    origin = int(usage.start_us[keep].min() // WINDOW_US * WINDOW_US)
    window = (usage.start_us - origin) // WINDOW_US
    duration = np.clip(usage.end_us - usage.start_us, 1, WINDOW_US).astype(np.float64)
    key = _key(usage.job_id, usage.task_index)
    windows = int(window[keep].max()) + 1
    order = np.lexsort((window, key))
    order = order[keep[order]]
    k, w = key[order], window[order]
    heads = np.flatnonzero(np.concatenate(([True], (k[1:] != k[:-1]) | (w[1:] != w[:-1]))))
    dur = duration[order]

    def weighted(values: FloatArray) -> FloatArray:
        v = values[order]
        ok = ~np.isnan(v)
        num = np.add.reduceat(np.where(ok, v * dur, 0.0), heads)
        den = np.add.reduceat(np.where(ok, dur, 0.0), heads)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(den > 0, num / den, np.nan)

    def peak(values: FloatArray) -> FloatArray:
        v = values[order]
        out = np.fmax.reduceat(np.where(np.isnan(v), -np.inf, v), heads)
        return np.where(np.isneginf(out), np.nan, out)

    mm, mp = weighted(usage.memory_mean), peak(usage.memory_peak)
    cm, cp = weighted(usage.cpu_mean), peak(usage.cpu_peak)
    assigned = peak(usage.assigned_memory)
    deciles = None
    if usage.cpu_deciles is not None:
        d = usage.cpu_deciles[order]
        deciles = np.stack(
            [np.add.reduceat(np.nan_to_num(d[:, q]) * dur, heads) for q in range(CPU_DECILES)], axis=1
        )
        deciles /= np.add.reduceat(dur, heads)[:, None]
        missing = np.add.reduceat(np.isnan(d).any(axis=1).astype(np.int64), heads) > 0
        deciles = np.where(missing[:, None], np.nan, deciles)
    row_key, row_window = k[heads], w[heads]
    task_heads = np.flatnonzero(np.concatenate(([True], row_key[1:] != row_key[:-1])))
    task_ends = np.concatenate((task_heads[1:], [row_key.size]))

    # Requests per task, in force from their event's window on.
    limits = _request_series(events, origin, scale)
    traits = _traits(usage, events, scale, trace, limits)
    tasks: list[TaskSignal] = []
    for lo, hi in zip(task_heads, task_ends, strict=True):
        first, last = int(row_window[lo]), int(row_window[hi - 1])
        span = last - first + 1
        idx = row_window[lo:hi] - first

        def series(
            values: FloatArray,
            unit: float,
            rows: slice = slice(lo, hi),
            idx: IntArray = idx,
            span: int = span,
        ) -> FloatArray:
            return _on_span(values[rows] * unit, idx, span)

        job, task = int(row_key[lo] >> _TASK_BITS), int(row_key[lo] & ((1 << _TASK_BITS) - 1))
        memory_limit, cpu_limit = _task_limits(limits, int(row_key[lo]), first, span)
        memory_limit = np.where(np.isnan(memory_limit), series(assigned, 1.0), memory_limit)
        dec = None
        if deciles is not None:
            dec = np.full((span, CPU_DECILES), np.nan)
            dec[idx] = deciles[lo:hi] * scale.cpu_millicores
        tasks.append(
            TaskSignal(
                job_id=job,
                task_index=task,
                first_window=first,
                memory_mean=series(mm, scale.memory_bytes),
                memory_peak=series(mp, scale.memory_bytes),
                cpu_mean=series(cm, scale.cpu_millicores),
                cpu_peak=series(cp, scale.cpu_millicores),
                memory_limit=memory_limit * scale.memory_bytes,
                cpu_limit=cpu_limit * scale.cpu_millicores,
                cpu_deciles=dec,
            )
        )
    return TraceTasks(tasks, traits, windows, origin)


def _on_span(values: FloatArray, index: IntArray, span: int) -> FloatArray:
    out = np.full(span, np.nan)
    out[index] = values
    return out


@dataclass(frozen=True, eq=False)
class _Requests:
    key: IntArray  # sorted by (key, window)
    window: IntArray
    cpu: FloatArray
    memory: FloatArray


def _request_series(events: EventRows, origin: int, scale: MachineScale) -> _Requests:
    has = ~(np.isnan(events.cpu_request) & np.isnan(events.memory_request))
    key = _key(events.job_id[has], events.task_index[has])
    window = np.maximum((events.time_us[has] - origin) // WINDOW_US, 0)
    order = np.lexsort((events.time_us[has], key))
    return _Requests(
        key[order], window[order], events.cpu_request[has][order], events.memory_request[has][order]
    )


def _task_limits(requests: _Requests, key: int, first: int, span: int) -> tuple[FloatArray, FloatArray]:
    """The task's requests over windows ``first .. first + span - 1`` (NaN before any is known)."""
    lo, hi = np.searchsorted(requests.key, [key, key + 1])
    memory = np.full(span, np.nan)
    cpu = np.full(span, np.nan)
    for i in range(lo, hi):
        at = max(int(requests.window[i]) - first, 0)
        if at >= span:
            break
        if not np.isnan(requests.memory[i]):
            memory[at:] = requests.memory[i]
        if not np.isnan(requests.cpu[i]):
            cpu[at:] = requests.cpu[i]
    return memory, cpu


def _traits(
    usage: UsageRows, events: EventRows, scale: MachineScale, trace: str, requests: _Requests
) -> dict[int, JobTraits]:
    del scale  # normalised memory is already in machines
    out: dict[int, JobTraits] = {}
    threshold = PRODUCTION_PRIORITY[trace]
    jobs = np.unique(usage.job_id)
    for job in jobs.tolist():
        mask = events.job_id == job
        priority = int(events.priority[mask].max()) if mask.any() else -1
        klass = int(events.scheduling_class[mask].max()) if mask.any() else -1
        lo, hi = np.searchsorted(requests.key, [job << _TASK_BITS, (job + 1) << _TASK_BITS])
        tasks = np.unique(requests.key[lo:hi]).size
        memory = requests.memory[lo:hi]
        per_task = float(np.nanmax(memory)) if np.isfinite(memory).any() else 0.0
        serving = priority >= threshold
        out[job] = JobTraits(
            job_class=AppClass.LATENCY_SENSITIVE if serving else AppClass.BATCH,
            latency=LatencySensitivity.HIGH
            if klass >= LATENCY_SENSITIVE_CLASS
            else LatencySensitivity.MODERATE,
            oom_tolerance=default_oom_tolerance(tasks * per_task),
            priority=priority,
            kind=trace,
        )
    return out


def _lines(paths: Iterable[Path]) -> Iterator[str]:
    for path in sorted(paths):
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as handle:  # type: ignore[operator]
            yield from handle


def _table_files(directory: Path, table: str, suffixes: tuple[str, ...]) -> list[Path]:
    folder = directory / table
    if not folder.is_dir():
        return []
    return [p for p in folder.iterdir() if p.is_file() and p.name.endswith(suffixes)]


def read_google2011_rowwise(directory: Path | str, scale: MachineScale | None = None) -> TraceTasks:
    """A 2011 trace directory (``task_usage/``, ``task_events/`` with CSV or CSV.gz parts)."""
    root = Path(directory)
    usage_files = _table_files(root, "task_usage", (".csv", ".csv.gz"))
    if not usage_files:
        raise FileNotFoundError(f"no task_usage/*.csv[.gz] under {root}")
    usage = parse_google2011_task_usage_rowwise(_lines(usage_files))
    events = parse_google2011_task_events_rowwise(
        _lines(_table_files(root, "task_events", (".csv", ".csv.gz")))
    )
    return build_tasks_rowwise(usage, events, scale or MachineScale(), "google2011")


def read_google2019_rowwise(directory: Path | str, scale: MachineScale | None = None) -> TraceTasks:
    """A 2019 trace directory (``instance_usage/``, optional ``instance_events/``, JSON or JSON.gz)."""
    root = Path(directory)
    usage_files = _table_files(root, "instance_usage", (".json", ".json.gz"))
    if not usage_files:
        raise FileNotFoundError(f"no instance_usage/*.json[.gz] under {root}")
    usage = parse_google2019_instance_usage_rowwise(_lines(usage_files))
    event_files = _table_files(root, "instance_events", (".json", ".json.gz"))
    events = (
        parse_google2019_instance_events_rowwise(_lines(event_files)) if event_files else EventRows.empty()
    )
    return build_tasks_rowwise(usage, events, scale or MachineScale(), "google2019")


# ---------------------------------------------------------------- Azure VM table (row by row)

AZURE_COLUMNS = (
    "vmid",
    "subscriptionid",
    "deploymentid",
    "vmcreated",
    "vmdeleted",
    "maxcpu",
    "avgcpu",
    "p95maxcpu",
    "vmcategory",
    "vmcorecountbucket",
    "vmmemorybucket",
)
CATEGORY_NAMES = ("Delay-insensitive", "Interactive", "Unknown")
SAMPLE_SECONDS = 300.0


def bucket_value(text: str) -> float:
    """A bucket label as a number: ``"8"`` -> 8; an open bucket ``">24"`` -> 2 x 24 (a guess)."""
    text = text.strip()
    if text.startswith(">"):
        return 2.0 * float(text[1:])
    return float(text)


def parse_azure_vm_table_rowwise(lines: Iterable[str], max_owners: int = 256) -> VmTrace:
    """Parses CSV lines of an Azure VM table; rows with missing fields are skipped."""
    rows = csv.reader(line for line in lines if line.strip())
    order = {name: i for i, name in enumerate(AZURE_COLUMNS)}
    ids: list[str] = []
    subs: list[str] = []
    created: list[float] = []
    deleted: list[float] = []
    cats: list[int] = []
    cores: list[float] = []
    memory: list[float] = []
    category_codes = {name.lower(): i for i, name in enumerate(CATEGORY_NAMES)}
    for i, row in enumerate(rows):
        cells = [c.strip() for c in row]
        if i == 0 and {c.lower() for c in cells} >= set(AZURE_COLUMNS):
            order = {c.lower(): j for j, c in enumerate(cells)}
            continue
        try:
            c0 = float(cells[order["vmcreated"]])
            c1 = float(cells[order["vmdeleted"]])
            n_cores = bucket_value(cells[order["vmcorecountbucket"]])
            gib = bucket_value(cells[order["vmmemorybucket"]])
        except (IndexError, ValueError):
            continue
        if c1 < c0 or n_cores <= 0 or gib <= 0:
            continue
        ids.append(cells[order["vmid"]])
        subs.append(cells[order["subscriptionid"]])
        created.append(c0)
        deleted.append(c1)
        cats.append(category_codes.get(cells[order["vmcategory"]].lower(), len(CATEGORY_NAMES) - 1))
        cores.append(n_cores)
        memory.append(gib)
    n = len(ids)
    if n == 0:
        raise ValueError("no VM rows in the Azure table")
    # Owner codes: frequent subscriptions keep their own code, rare ones share the last.
    frequent = [s for s, _ in Counter(subs).most_common(max(max_owners - 1, 1))]
    codes = {s: i for i, s in enumerate(frequent)}
    other = len(codes)
    created_a = np.asarray(created, dtype=np.float64)
    deleted_a = np.asarray(deleted, dtype=np.float64)
    horizon = float(deleted_a.max())
    order_rows = np.argsort(created_a, kind="stable")
    return VmTrace(
        vm_id=np.arange(n, dtype=np.int64),
        created=created_a[order_rows],
        deleted=deleted_a[order_rows],
        cores=np.asarray(cores, dtype=np.float64)[order_rows],
        memory_gib=np.asarray(memory, dtype=np.float64)[order_rows],
        ssd_gib=np.zeros(n),
        category=np.asarray(cats, dtype=np.int64)[order_rows],
        owner=np.asarray([codes.get(s, other) for s in subs], dtype=np.int64)[order_rows],
        zone=np.zeros(n, dtype=np.int64),
        tier=np.zeros(n, dtype=np.int64),
        horizon=horizon,
        censored=(deleted_a >= horizon - SAMPLE_SECONDS)[order_rows],
        category_names=CATEGORY_NAMES,
        tier_names=("standard",),
        source="azure",
    )


def read_azure_vm_table_rowwise(path: str | Path, max_owners: int = 256) -> VmTrace:
    """Reads ``vmtable.csv`` (or ``vmtable.csv.gz``) from ``path``."""
    path = Path(path)
    if path.suffix == ".gz":
        with gzip.open(path, "rt", newline="") as handle:
            trace = parse_azure_vm_table_rowwise(handle, max_owners)
    else:
        with path.open(newline="") as handle:
            trace = parse_azure_vm_table_rowwise(handle, max_owners)
    return VmTrace(**{**trace.__dict__, "source": f"azure:{path.name}"})
