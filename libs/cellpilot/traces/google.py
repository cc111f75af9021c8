"""Readers of the public Google traces (2011 v2.1, 2019 v3) on the columnar engine.

The formats are described in :mod:`cellpilot.workloads.google_traces`. A trace directory's
tables may be gzip (or plain) CSV / newline-delimited JSON shards as Google publishes them,
or Parquet shards with the same column names, or a mix (:mod:`cellpilot.traces.google_formats`).

What runs in the engine, streaming the shards (bounded by :class:`EngineSettings`):

1. usage rows are normalised, and merged per (job, task, window) — time-weighted means
   (weights: the row's duration, at most a window), maxima of peaks; rows without a memory
   sample only make their job known;
2. events are kept in trace order; those carrying a request are placed on the grid;
3. per job: merged rows, the highest priority and scheduling class, the tasks with a
   request and the largest memory request (and, to choose long-running jobs, the windows
   some task of the job runs in).

Python then receives one batch of whole jobs at a time (``batch_rows`` merged rows) and
the core lays the tasks out (:func:`~cellpilot.workloads.google_traces.assemble_tasks`).
:func:`read_google2011` / :func:`read_google2019` return every task
(:class:`~cellpilot.workloads.google_traces.TraceTasks`); :meth:`GoogleTrace.jobs` streams
only the jobs a study keeps (long-running, optionally serving), choosing them in the engine.
The ``parse_*`` functions read trace lines (for small inputs and tests) through the same
engine, and :func:`build_tasks` runs the same merge over rows already in memory.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from cellpilot.traces.engine import EngineSettings, TraceSession, csv_source, json_source, table_files
from cellpilot.traces.google_formats import (
    DECILES,
    EVENT_COLUMNS,
    NORMALISE,
    TABLES,
    USAGE_FLOATS,
    normalised_source,
)
from cellpilot.workloads.google_traces import (
    PRODUCTION_PRIORITY,
    TRACE_START_US,
    WINDOW_US,
    EventRows,
    MachineScale,
    TaskRequests,
    TaskWindows,
    TraceTasks,
    UsageRows,
    assemble_tasks,
    job_traits,
)
from cellpilot.workloads.task_signals import JobSignals, JobTraits, TaskSignal, group_tasks

TRACES = ("google2011", "google2019")
CLUSTER_ABOVE_BATCHES = 4


def _merge_sql(deciles: bool) -> str:
    """Usage rows merged per (job, task, window): time-weighted means, maxima of peaks."""
    kept = "memory_mean IS NOT NULL"
    decile_rows = "".join(f", CASE WHEN {kept} THEN {d} END AS {d}" for d in DECILES) if deciles else ""
    decile_sums = (
        "".join(f", sum(coalesce({d}, 0) * dur) / sum(dur) AS {d}" for d in DECILES)
        + ", bool_or("
        + " OR ".join(f"{d} IS NULL" for d in DECILES)
        + ") AS deciles_missing"
        if deciles
        else ""
    )
    return f"""
        SELECT job_id, task_index, w, count(memory_mean) AS kept,
               sum(memory_mean * dur) / sum(dur) AS memory_mean,
               sum(cpu_mean * dur) / sum(CASE WHEN cpu_mean IS NOT NULL THEN dur END) AS cpu_mean,
               max(memory_peak) AS memory_peak, max(cpu_peak) AS cpu_peak,
               max(assigned_memory) AS assigned_memory{decile_sums}
        FROM (
            SELECT job_id, task_index, CAST(floor(start_us / {WINDOW_US}.0) AS BIGINT) AS w, memory_mean,
                   CASE WHEN {kept}
                       THEN CAST(least(greatest(end_us - start_us, 1), {WINDOW_US}) AS DOUBLE) END AS dur,
                   CASE WHEN {kept} THEN cpu_mean END AS cpu_mean,
                   CASE WHEN {kept} THEN memory_peak END AS memory_peak,
                   CASE WHEN {kept} THEN cpu_peak END AS cpu_peak,
                   CASE WHEN {kept} THEN assigned_memory END AS assigned_memory{decile_rows}
            FROM usage
        )
        GROUP BY job_id, task_index, w
    """


class GoogleTrace:
    """A Google trace merged in the engine: its grid, per-job aggregates and tasks in job batches.

    Made by :func:`open_google_trace`; valid while its session is open.
    """

    def __init__(
        self, session: TraceSession, trace: str, scale: MachineScale, deciles: bool, what: str
    ) -> None:
        self.session = session
        self.trace = trace
        self.scale = scale
        self.deciles = deciles
        run = session.execute
        # Merged rows are kept unsorted (a global sort of every merged row costs as much as the
        # merge itself; the core lays rows out in any order). Without insertion order the
        # engine inserts from all threads at once.
        run("SET preserve_insertion_order = false", what)
        run(f"CREATE TABLE task_windows AS {_merge_sql(deciles)}", what)
        grid = session.fetch(
            "SELECT count(*) AS n, coalesce(min(w), 0) AS lo, coalesce(max(w), -1) AS hi "
            "FROM task_windows WHERE kept > 0",
            trace,
        )
        known = int(grid["n"][0]) > 0
        self.origin_window = int(grid["lo"][0]) if known else TRACE_START_US // WINDOW_US
        self.windows = int(grid["hi"][0]) - self.origin_window + 1 if known else 0
        self.origin_us = self.origin_window * WINDOW_US
        run(
            f"""CREATE TABLE requests AS
                SELECT job_id, task_index, time_us, rowid AS seq, cpu_request, memory_request,
                       CAST(greatest(floor((time_us - {self.origin_us}) / {WINDOW_US}.0), 0) AS BIGINT) AS w
                FROM events WHERE cpu_request IS NOT NULL OR memory_request IS NOT NULL
                ORDER BY job_id, task_index, time_us, seq""",
            f"{trace} events",
        )
        self._jobs = session.fetch(
            """SELECT u.job_id, u.rows,
                      coalesce(e.priority, -1) AS priority,
                      coalesce(e.scheduling_class, -1) AS scheduling_class,
                      coalesce(r.tasks, 0) AS tasks, coalesce(r.task_memory, 0.0) AS task_memory
               FROM (SELECT job_id, count(*) FILTER (WHERE kept > 0) AS rows
                     FROM task_windows GROUP BY job_id) AS u
               LEFT JOIN (SELECT job_id, max(priority) AS priority, max(scheduling_class) AS scheduling_class
                          FROM events GROUP BY job_id) AS e ON e.job_id = u.job_id
               LEFT JOIN (SELECT job_id, count(DISTINCT task_index) AS tasks,
                                 max(memory_request) AS task_memory
                          FROM requests GROUP BY job_id) AS r ON r.job_id = u.job_id
               ORDER BY u.job_id""",
            f"{trace} jobs",
        )
        # Reading a batch filters the merged rows by a range of job ids. Past a few batches,
        # cluster them by job once, so each read touches only its own row groups.
        if int(self._jobs["rows"].sum()) > CLUSTER_ABOVE_BATCHES * session.settings.batch_rows:
            run("SET preserve_insertion_order = true", what)  # stored in that order
            run("CREATE TABLE clustered AS SELECT * FROM task_windows ORDER BY job_id", what)
            run("SET preserve_insertion_order = false", what)
            run("DROP TABLE task_windows", what)
            run("ALTER TABLE clustered RENAME TO task_windows", what)

    def traits(self, jobs: npt.NDArray[np.int64] | None = None) -> dict[int, JobTraits]:
        """Every job's traits (of every job with usage rows), or those of ``jobs``."""
        rows = slice(None) if jobs is None else np.isin(self._jobs["job_id"], jobs)
        j = self._jobs
        return job_traits(
            self.trace,
            j["job_id"][rows],
            j["priority"][rows],
            j["scheduling_class"][rows],
            j["tasks"][rows],
            j["task_memory"][rows],
        )

    def _selected(self, min_coverage: float | None, serving_only: bool) -> npt.NDArray[np.int64]:
        j = self._jobs
        keep = j["rows"] > 0
        if min_coverage is not None and self.windows:
            # Windows in which some task of the job runs (the job's coverage of the grid).
            covered = self.session.fetch(
                """SELECT job_id, count(DISTINCT w) AS covered FROM task_windows WHERE kept > 0
                   GROUP BY job_id ORDER BY job_id""",
                f"{self.trace} jobs",
            )
            windows = np.zeros(j["job_id"].size, dtype=np.int64)
            windows[np.searchsorted(j["job_id"], covered["job_id"])] = covered["covered"]
            keep &= windows / self.windows >= min_coverage
        if serving_only:
            keep &= j["priority"] >= PRODUCTION_PRIORITY[self.trace]
        return np.asarray(j["job_id"][keep], dtype=np.int64)

    def _batches(self, jobs: npt.NDArray[np.int64]) -> Iterator[npt.NDArray[np.int64]]:
        """The chosen jobs (sorted) in batches of about ``batch_rows`` merged rows (whole jobs)."""
        rows = self._jobs["rows"][np.searchsorted(self._jobs["job_id"], jobs)]
        limit = self.session.settings.batch_rows
        start, total = 0, 0
        for i, n in enumerate(rows.tolist()):
            if total and total + n > limit:
                yield jobs[start:i]
                start, total = i, 0
            total += n
        if start < jobs.size:
            yield jobs[start:]

    def _batch(self, jobs: npt.NDArray[np.int64], every: bool) -> tuple[TaskWindows, TaskRequests]:
        lo, hi = int(jobs[0]), int(jobs[-1])
        chosen = ""
        if not every:
            self.session.register("batch_jobs", {"job_id": jobs})
            chosen = " AND job_id IN (SELECT job_id FROM batch_jobs)"
        columns = "job_id, task_index, w, memory_mean, memory_peak, cpu_mean, cpu_peak, assigned_memory"
        if self.deciles:
            columns += ", deciles_missing, " + ", ".join(DECILES)
        got = self.session.fetch(
            f"SELECT {columns} FROM task_windows WHERE kept > 0 AND job_id BETWEEN ? AND ?{chosen}",
            f"{self.trace} usage",
            [lo, hi],
        )
        deciles = None
        if self.deciles:
            deciles = np.stack([got[d] for d in DECILES], axis=1)
            deciles[got["deciles_missing"].astype(bool)] = np.nan
        windows = TaskWindows(
            job_id=got["job_id"],
            task_index=got["task_index"],
            window=got["w"] - self.origin_window,
            memory_mean=got["memory_mean"],
            memory_peak=got["memory_peak"],
            cpu_mean=got["cpu_mean"],
            cpu_peak=got["cpu_peak"],
            assigned_memory=got["assigned_memory"],
            cpu_deciles=deciles,
        )
        req = self.session.fetch(
            f"""SELECT job_id, task_index, w, cpu_request, memory_request FROM requests
                WHERE job_id BETWEEN ? AND ?{chosen} ORDER BY job_id, task_index, time_us, seq""",
            f"{self.trace} events",
            [lo, hi],
        )
        requests = TaskRequests(
            job_id=req["job_id"],
            task_index=req["task_index"],
            window=req["w"],
            cpu=req["cpu_request"],
            memory=req["memory_request"],
        )
        return windows, requests

    def task_batches(
        self, min_coverage: float | None = None, serving_only: bool = False
    ) -> Iterator[list[TaskSignal]]:
        """The chosen jobs' tasks, one batch of whole jobs at a time (jobs and tasks in id order)."""
        jobs = self._selected(min_coverage, serving_only)
        every = min_coverage is None and not serving_only
        for batch in self._batches(jobs):
            windows, requests = self._batch(batch, every)
            yield assemble_tasks(windows, requests, self.scale)

    def tasks(self) -> list[TaskSignal]:
        return [task for batch in self.task_batches() for task in batch]

    def jobs(self, min_coverage: float = 0.9, serving_only: bool = False) -> Iterator[JobSignals]:
        """Long-running jobs (§4.1.2, as :meth:`TraceTasks.jobs`), chosen in the engine and stacked
        one batch at a time: memory holds one batch plus what the caller keeps."""
        for tasks in self.task_batches(min_coverage, serving_only):
            ids = np.unique(np.array([t.job_id for t in tasks], dtype=np.int64))
            yield from group_tasks(tasks, self.traits(ids), self.windows)

    def read_all(self) -> TraceTasks:
        if self.windows == 0:
            return TraceTasks([], {}, 0, TRACE_START_US)
        return TraceTasks(self.tasks(), self.traits(), self.windows, self.origin_us)


_EMPTY_EVENTS = (
    "(SELECT NULL::BIGINT AS time_us, NULL::BIGINT AS job_id, NULL::BIGINT AS task_index, "
    "NULL::BIGINT AS priority, NULL::BIGINT AS scheduling_class, NULL::DOUBLE AS cpu_request, "
    "NULL::DOUBLE AS memory_request WHERE false)"
)


def _load(session: TraceSession, usage: str, events: str | None, trace: str, what: str) -> None:
    """The usage view and the events table, in trace order (its ``rowid`` breaks ties of one time)."""
    session.execute(f"CREATE VIEW usage AS SELECT * FROM {usage}", what)
    session.execute(
        f"CREATE TABLE events AS SELECT {', '.join(EVENT_COLUMNS)} FROM {events or _EMPTY_EVENTS}", what
    )


@contextmanager
def open_google_trace(
    trace: str,
    directory: Path | str,
    scale: MachineScale | None = None,
    settings: EngineSettings | None = None,
) -> Iterator[GoogleTrace]:
    """A trace directory merged in the engine (``trace``: google2011 or google2019)."""
    if trace not in TRACES:
        raise ValueError(f"unknown trace {trace!r}; known: {', '.join(TRACES)}")
    root = Path(directory)
    usage_table, text_format, _ = TABLES[(trace, "usage")]
    events_table = TABLES[(trace, "events")][0]
    usage_files = table_files(root, usage_table)
    if not usage_files:
        raise FileNotFoundError(f"no {usage_table}/*.{text_format}[.gz] or *.parquet under {root}")
    with TraceSession(settings) as session:
        what = f"{trace} trace {root}"
        usage = normalised_source(session, trace, "usage", usage_files, f"{what}: {usage_table}")
        event_files = table_files(root, events_table)
        events = (
            normalised_source(session, trace, "events", event_files, f"{what}: {events_table}")
            if event_files
            else None
        )
        _load(session, usage, events, trace, what)
        yield GoogleTrace(session, trace, scale or MachineScale(), trace == "google2019", what)


def read_google2011(
    directory: Path | str, scale: MachineScale | None = None, *, settings: EngineSettings | None = None
) -> TraceTasks:
    """A 2011 trace directory (``task_usage/``, ``task_events/``: CSV, CSV.gz or Parquet shards)."""
    with open_google_trace("google2011", directory, scale, settings) as trace:
        return trace.read_all()


def read_google2019(
    directory: Path | str, scale: MachineScale | None = None, *, settings: EngineSettings | None = None
) -> TraceTasks:
    """A 2019 trace directory (``instance_usage/``, optional ``instance_events/``: JSON[.gz] or Parquet)."""
    with open_google_trace("google2019", directory, scale, settings) as trace:
        return trace.read_all()


# ---------------------------------------------------------------- rows in memory (small inputs, tests)


@contextmanager
def _lines_source(lines: Iterable[str], suffix: str) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="cellpilot-lines-") as folder:
        path = Path(folder) / f"rows{suffix}"
        with path.open("w", encoding="utf-8") as handle:
            for line in lines:
                handle.write(line if line.endswith("\n") else line + "\n")
        yield path


def _read_rows(trace: str, table: str, lines: Iterable[str]) -> dict[str, npt.NDArray[Any]]:
    text_format, types = TABLES[(trace, table)][1:]
    with _lines_source(lines, f".{text_format}") as path, TraceSession() as session:
        what = f"{trace} {table} rows"
        source = csv_source([path], types) if text_format == "csv" else json_source([path], types)
        rows = NORMALISE[(trace, table)](session.column_types(source, what), source, what)
        return session.fetch(f"SELECT * FROM {rows}", what)


def _usage_rows(got: dict[str, npt.NDArray[Any]], deciles: bool) -> UsageRows:
    return UsageRows(
        start_us=got["start_us"].astype(np.int64),
        end_us=got["end_us"].astype(np.int64),
        job_id=got["job_id"].astype(np.int64),
        task_index=got["task_index"].astype(np.int64),
        **{name: got[name].astype(np.float64) for name in USAGE_FLOATS},
        cpu_deciles=np.stack([got[d].astype(np.float64) for d in DECILES], axis=1) if deciles else None,
    )


def _event_rows(got: dict[str, npt.NDArray[Any]]) -> EventRows:
    return EventRows(
        time_us=got["time_us"].astype(np.int64),
        job_id=got["job_id"].astype(np.int64),
        task_index=got["task_index"].astype(np.int64),
        priority=got["priority"].astype(np.int64),
        scheduling_class=got["scheduling_class"].astype(np.int64),
        cpu_request=got["cpu_request"].astype(np.float64),
        memory_request=got["memory_request"].astype(np.float64),
    )


def parse_google2011_task_usage(lines: Iterable[str]) -> UsageRows:
    """Rows of ``task_usage`` part files; rows without a job, task or times are skipped."""
    return _usage_rows(_read_rows("google2011", "usage", lines), deciles=False)


def parse_google2011_task_events(lines: Iterable[str]) -> EventRows:
    """Rows of ``task_events`` part files."""
    return _event_rows(_read_rows("google2011", "events", lines))


def parse_google2019_instance_usage(lines: Iterable[str]) -> UsageRows:
    """NDJSON rows of ``instance_usage``; alloc-set rows (collection_type 1) are skipped."""
    return _usage_rows(_read_rows("google2019", "usage", lines), deciles=True)


def parse_google2019_instance_events(lines: Iterable[str]) -> EventRows:
    """NDJSON rows of ``instance_events`` (only rows naming a job instance are kept)."""
    return _event_rows(_read_rows("google2019", "events", lines))


def build_tasks(
    usage: UsageRows,
    events: EventRows,
    scale: MachineScale,
    trace: str,
    settings: EngineSettings | None = None,
) -> TraceTasks:
    """The same merge as :func:`read_google2011` / :func:`read_google2019`, over rows in memory."""
    if trace not in TRACES:
        raise ValueError(f"unknown trace {trace!r}; known: {', '.join(TRACES)}")
    if len(usage) == 0:
        return TraceTasks([], {}, 0, TRACE_START_US)
    with TraceSession(settings) as session:
        columns: dict[str, npt.NDArray[Any]] = {
            "start_us": usage.start_us,
            "end_us": usage.end_us,
            "job_id": usage.job_id,
            "task_index": usage.task_index,
            **{name: getattr(usage, name) for name in USAGE_FLOATS},
        }
        deciles = usage.cpu_deciles is not None
        if usage.cpu_deciles is not None:
            columns |= {d: np.ascontiguousarray(usage.cpu_deciles[:, q]) for q, d in enumerate(DECILES)}
        session.register("usage_rows", columns)
        session.register("event_rows", {name: getattr(events, name) for name in EVENT_COLUMNS})
        _load(session, "usage_rows", "event_rows" if len(events) else None, trace, f"{trace} rows")
        return GoogleTrace(session, trace, scale, deciles, f"{trace} rows").read_all()
