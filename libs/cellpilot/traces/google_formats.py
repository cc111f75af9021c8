"""The Google traces' table formats, normalised for the engine (2011 v2.1 CSV, 2019 v3 JSON, Parquet).

Each table's shards — text as Google publishes them, or Parquet with the same column names
(2019: nested ``{cpus, memory}`` structs or flattened ``average_usage_cpus`` /
``average_usage.cpus`` columns) — become one relation with the columns the readers use:

* usage: ``start_us, end_us, job_id, task_index, memory_mean, memory_peak, cpu_mean,
  cpu_peak, cpu_sample, assigned_memory`` (and, 2019, the CPU deciles ``d0 .. d10``);
* events: ``time_us, job_id, task_index, priority, scheduling_class, cpu_request,
  memory_request`` (priority and class -1 when absent).

Rows lacking a time, job or task are dropped, as are 2019 alloc-set rows (collection_type 1);
a distribution that is not the 11 deciles counts as unknown; absent values are NULL.
"""

from __future__ import annotations

from pathlib import Path

from duckdb.sqltypes import DuckDBPyType

from cellpilot.traces.engine import (
    TraceSession,
    csv_source,
    field_expression,
    json_source,
    parquet_source,
    quoted,
)
from cellpilot.workloads.google_traces import TASK_EVENTS_COLUMNS, TASK_USAGE_COLUMNS
from cellpilot.workloads.task_signals import CPU_DECILES

DECILES = tuple(f"d{q}" for q in range(CPU_DECILES))
USAGE_FLOATS = ("memory_mean", "memory_peak", "cpu_mean", "cpu_peak", "cpu_sample", "assigned_memory")
EVENT_COLUMNS = (
    "time_us",
    "job_id",
    "task_index",
    "priority",
    "scheduling_class",
    "cpu_request",
    "memory_request",
)

# 2011 CSV: the columns the readers use get their types; the rest stay text (never converted).
_2011_USAGE_TYPES = dict.fromkeys(TASK_USAGE_COLUMNS, "VARCHAR") | {
    "start_time": "BIGINT",
    "end_time": "BIGINT",
    "job_id": "BIGINT",
    "task_index": "BIGINT",
    "cpu_rate": "DOUBLE",
    "canonical_memory_usage": "DOUBLE",
    "assigned_memory_usage": "DOUBLE",
    "maximum_memory_usage": "DOUBLE",
    "maximum_cpu_rate": "DOUBLE",
    "sampled_cpu_usage": "DOUBLE",
}
_2011_EVENT_TYPES = dict.fromkeys(TASK_EVENTS_COLUMNS, "VARCHAR") | {
    "timestamp": "BIGINT",
    "job_id": "BIGINT",
    "task_index": "BIGINT",
    "scheduling_class": "DOUBLE",
    "priority": "DOUBLE",
    "cpu_request": "DOUBLE",
    "memory_request": "DOUBLE",
}
_CPU_MEMORY = "STRUCT(cpus DOUBLE, memory DOUBLE)"
# 2019 JSON: 64-bit integers arrive as strings (BigQuery) or numbers; nested or flattened fields.
_2019_USAGE_TYPES = {
    "start_time": "VARCHAR",
    "end_time": "VARCHAR",
    "collection_id": "VARCHAR",
    "instance_index": "VARCHAR",
    "collection_type": "VARCHAR",
    "average_usage": _CPU_MEMORY,
    "maximum_usage": _CPU_MEMORY,
    "random_sample_usage": "STRUCT(cpus DOUBLE)",
    "assigned_memory": "DOUBLE",
    "cpu_usage_distribution": "DOUBLE[]",
} | {
    f"{group}{sep}{field}": "DOUBLE"
    for group, field in (
        ("average_usage", "cpus"),
        ("average_usage", "memory"),
        ("maximum_usage", "cpus"),
        ("maximum_usage", "memory"),
        ("random_sample_usage", "cpus"),
    )
    for sep in ("_", ".")
}
_2019_EVENT_TYPES = {
    "time": "VARCHAR",
    "collection_id": "VARCHAR",
    "instance_index": "VARCHAR",
    "collection_type": "VARCHAR",
    "priority": "VARCHAR",
    "scheduling_class": "VARCHAR",
    "resource_request": _CPU_MEMORY,
} | {f"resource_request{sep}{field}": "DOUBLE" for field in ("cpus", "memory") for sep in ("_", ".")}


def _nested(group: str, field: str) -> tuple[tuple[str, ...], ...]:
    return ((group, field), (f"{group}_{field}",), (f"{group}.{field}",))


def _pick(types: dict[str, DuckDBPyType], sql_type: str, *candidates: tuple[str, ...]) -> str:
    expression = field_expression(types, *candidates)
    return f"TRY_CAST({expression} AS {sql_type})" if expression else f"NULL::{sql_type}"


def _need(types: dict[str, DuckDBPyType], what: str, *names: str) -> None:
    missing = [name for name in names if name not in types]
    if missing:
        raise ValueError(f"{what}: no column {', '.join(missing)}")


def _task_keys(
    types: dict[str, DuckDBPyType], what: str, job: str, task: str, **times: str
) -> dict[str, str]:
    """The columns that place a row (its time or times, job id, task index), all required."""
    _need(types, what, *times.values(), job, task)
    return {name: _pick(types, "BIGINT", (column,)) for name, column in times.items()} | {
        "job_id": _pick(types, "BIGINT", (job,)),
        "task_index": _pick(types, "BIGINT", (task,)),
    }


def _usage_2011(types: dict[str, DuckDBPyType], source: str, what: str) -> str:
    pick = _task_keys(types, what, "job_id", "task_index", start_us="start_time", end_us="end_time") | {
        "memory_mean": _pick(types, "DOUBLE", ("canonical_memory_usage",)),
        "memory_peak": _pick(types, "DOUBLE", ("maximum_memory_usage",)),
        "cpu_mean": _pick(types, "DOUBLE", ("cpu_rate",)),
        "cpu_peak": _pick(types, "DOUBLE", ("maximum_cpu_rate",)),
        "cpu_sample": _pick(types, "DOUBLE", ("sampled_cpu_usage",)),
        "assigned_memory": _pick(types, "DOUBLE", ("assigned_memory_usage",)),
    }
    return _rows(pick, source, "start_us", "end_us", "job_id", "task_index")


def _usage_2019(types: dict[str, DuckDBPyType], source: str, what: str) -> str:
    keys = _task_keys(
        types, what, "collection_id", "instance_index", start_us="start_time", end_us="end_time"
    )
    dist = field_expression(types, ("cpu_usage_distribution",))
    pick = (
        keys
        | {
            "memory_mean": _pick(types, "DOUBLE", *_nested("average_usage", "memory")),
            "memory_peak": _pick(types, "DOUBLE", *_nested("maximum_usage", "memory")),
            "cpu_mean": _pick(types, "DOUBLE", *_nested("average_usage", "cpus")),
            "cpu_peak": _pick(types, "DOUBLE", *_nested("maximum_usage", "cpus")),
            "cpu_sample": _pick(types, "DOUBLE", *_nested("random_sample_usage", "cpus")),
            "assigned_memory": _pick(types, "DOUBLE", ("assigned_memory",)),
        }
        | {
            # A distribution that is not the 11 deciles counts as unknown.
            name: (
                f"CASE WHEN len({dist}) = {CPU_DECILES} THEN TRY_CAST({dist}[{q + 1}] AS DOUBLE) END"
                if dist
                else "NULL::DOUBLE"
            )
            for q, name in enumerate(DECILES)
        }
    )
    return _rows(pick, source, "start_us", "end_us", "job_id", "task_index", where=_not_alloc_set(types))


def _events(
    types: dict[str, DuckDBPyType],
    keys: dict[str, str],
    source: str,
    cpu_request: tuple[tuple[str, ...], ...],
    memory_request: tuple[tuple[str, ...], ...],
    where: str = "true",
) -> str:
    """Task events of either format: ``keys`` from :func:`_task_keys`, and where it keeps the requests."""
    pick = keys | {
        "priority": _level(_pick(types, "DOUBLE", ("priority",))),
        "scheduling_class": _level(_pick(types, "DOUBLE", ("scheduling_class",))),
        "cpu_request": _pick(types, "DOUBLE", *cpu_request),
        "memory_request": _pick(types, "DOUBLE", *memory_request),
    }
    return _rows(pick, source, "time_us", "job_id", "task_index", where=where)


def _events_2011(types: dict[str, DuckDBPyType], source: str, what: str) -> str:
    keys = _task_keys(types, what, "job_id", "task_index", time_us="timestamp")
    return _events(types, keys, source, (("cpu_request",),), (("memory_request",),))


def _events_2019(types: dict[str, DuckDBPyType], source: str, what: str) -> str:
    keys = _task_keys(types, what, "collection_id", "instance_index", time_us="time")
    cpu, memory = _nested("resource_request", "cpus"), _nested("resource_request", "memory")
    return _events(types, keys, source, cpu, memory, where=_not_alloc_set(types))


def _level(expression: str) -> str:
    """A priority or scheduling class as an integer, -1 when absent."""
    return f"coalesce(CAST(trunc({expression}) AS BIGINT), -1)"


def _not_alloc_set(types: dict[str, DuckDBPyType]) -> str:
    kind = field_expression(types, ("collection_type",))
    return f"coalesce(trunc(TRY_CAST({kind} AS DOUBLE)), 0) <> 1" if kind else "true"


def _rows(pick: dict[str, str], source: str, *required: str, where: str = "true") -> str:
    """Normalised rows: the picked columns, rows lacking a required one dropped."""
    inner = ", ".join(f"{expression} AS {quoted(name)}" for name, expression in pick.items())
    kept = " AND ".join(f"{quoted(name)} IS NOT NULL" for name in required)
    return f"(SELECT * FROM (SELECT {inner} FROM {source} WHERE {where}) WHERE {kept})"


NORMALISE = {
    ("google2011", "usage"): _usage_2011,
    ("google2011", "events"): _events_2011,
    ("google2019", "usage"): _usage_2019,
    ("google2019", "events"): _events_2019,
}
TABLES = {
    ("google2011", "usage"): ("task_usage", "csv", _2011_USAGE_TYPES),
    ("google2011", "events"): ("task_events", "csv", _2011_EVENT_TYPES),
    ("google2019", "usage"): ("instance_usage", "json", _2019_USAGE_TYPES),
    ("google2019", "events"): ("instance_events", "json", _2019_EVENT_TYPES),
}


def normalised_source(
    session: TraceSession, trace: str, table: str, shards: dict[str, list[Path]], what: str
) -> str:
    """One normalised relation over every shard of a table, whatever their formats."""
    _, text_format, types = TABLES[(trace, table)]
    parts = []
    for kind, files in shards.items():
        if kind == "parquet":
            source = parquet_source(files)
        elif kind == text_format == "csv":
            source = csv_source(files, types)
        elif kind == text_format == "json":
            source = json_source(files, types)
        else:
            raise ValueError(f"{what}: {kind} shards are not a {trace} format ({files[0].name})")
        normalise = NORMALISE[(trace, table)]
        parts.append(normalise(session.column_types(source, what), source, what))
    return "(" + " UNION ALL ".join(f"SELECT * FROM {part}" for part in parts) + ")"
