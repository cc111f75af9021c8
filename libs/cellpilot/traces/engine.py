"""The columnar engine under trace ingest: a DuckDB session with bounded memory.

**Why DuckDB, not Arrow.** The readers do more than parse: they merge a task's usage rows
per 5-minute window, count each job's covered windows and fold its events into traits,
over traces of a billion rows (the 2011 ``task_usage`` alone). DuckDB runs those
aggregations and sorts inside the engine and spills them to disk past ``memory_limit``;
Arrow's compute layer keeps group-by state in memory, so the aggregation would end up in
Python or unbounded. DuckDB also reads everything the traces come as — headerless gzip
CSV shards, gzip newline-delimited JSON with nested records, Parquet — itself, streaming
each shard and reading shards in parallel, and hands results over as numpy arrays; it is
one wheel with no dependencies.

A :class:`TraceSession` is one in-memory database whose spill files live in a private
temporary directory, removed on close. Sources are SQL table functions over a list of
files (:func:`csv_source`, :func:`json_source`, :func:`parquet_source`); engine errors
(a malformed value, an unreadable file) surface as ``ValueError`` naming what was read.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import numpy.typing as npt
from duckdb.sqltypes import DuckDBPyType

# File formats by name: gzip is recognised by the engine from the ``.gz`` suffix.
FORMATS: dict[str, tuple[str, ...]] = {
    "csv": (".csv", ".csv.gz"),
    "json": (".json", ".json.gz", ".jsonl", ".jsonl.gz", ".ndjson", ".ndjson.gz"),
    "parquet": (".parquet",),
}


@dataclass(frozen=True)
class EngineSettings:
    """How much the engine may use; the Python side holds at most ``batch_rows`` merged rows."""

    memory_limit: str = "2GB"  # DuckDB's buffer limit; aggregations and sorts spill past it
    threads: int | None = None  # None: one per core
    batch_rows: int = 1_000_000  # task-windows handed to Python at a time
    spill_directory: Path | None = None  # None: a private temporary directory

    def __post_init__(self) -> None:
        if self.batch_rows < 1:
            raise ValueError("batch_rows must be >= 1")
        if self.threads is not None and self.threads < 1:
            raise ValueError("threads must be >= 1")


def quoted(name: str) -> str:
    """An SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def literal(text: str) -> str:
    """An SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def _file_list(files: Sequence[Path]) -> str:
    return "[" + ", ".join(literal(str(f)) for f in files) + "]"


def _struct(columns: Mapping[str, str]) -> str:
    return "{" + ", ".join(f"{literal(k)}: {literal(v)}" for k, v in columns.items()) + "}"


def csv_source(files: Sequence[Path], columns: Mapping[str, str], header: bool = False) -> str:
    """Headerless (or headed) CSV shards with the given column names and types, in file order.

    Missing trailing fields are NULL, as are empty ones; blank lines are skipped.
    """
    return (
        f"read_csv({_file_list(files)}, header={str(header).lower()}, auto_detect=false, "
        f"null_padding=true, strict_mode=false, columns={_struct(columns)})"
    )


def json_source(files: Sequence[Path], columns: Mapping[str, str]) -> str:
    """Newline-delimited JSON shards; keys not named in ``columns`` are not read, absent ones are NULL."""
    return (
        f"read_json({_file_list(files)}, format='newline_delimited', columns={_struct(columns)}, "
        "maximum_object_size=16777216)"
    )


def parquet_source(files: Sequence[Path]) -> str:
    """Parquet shards, columns matched by name across shards."""
    return f"read_parquet({_file_list(files)}, union_by_name=true)"


def table_files(root: Path, table: str) -> dict[str, list[Path]]:
    """The shards of ``root/table/`` by format (sorted by name); empty when the folder is missing."""
    folder = root / table
    out: dict[str, list[Path]] = {}
    if not folder.is_dir():
        return out
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        for name, suffixes in FORMATS.items():
            if path.name.endswith(suffixes):
                out.setdefault(name, []).append(path)
                break
    return out


def _filled(values: Any) -> npt.NDArray[Any]:
    """A fetched column as a plain array: NULL becomes NaN (floats) or must not occur."""
    if isinstance(values, np.ma.MaskedArray):
        if values.dtype.kind == "f":
            return np.asarray(values.filled(np.nan))
        if values.dtype.kind in "iu" and not values.mask.any():
            return np.asarray(values.data)
        if values.dtype.kind in "iu":
            raise ValueError("unexpected NULL in an integer column")
        return np.asarray(values.filled(None))
    return np.asarray(values)


class TraceSession:
    """One DuckDB database for one read, with its spill directory; use as a context manager."""

    def __init__(self, settings: EngineSettings | None = None) -> None:
        self.settings = settings or EngineSettings()
        self._own_spill = self.settings.spill_directory is None
        spill = Path(tempfile.mkdtemp(prefix="cellpilot-traces-")) if self._own_spill else None
        self.spill_directory = spill or Path(str(self.settings.spill_directory))
        self.spill_directory.mkdir(parents=True, exist_ok=True)
        self.connection = duckdb.connect(":memory:")
        self.connection.execute("SET enable_progress_bar = false")
        self.connection.execute(f"SET memory_limit = {literal(self.settings.memory_limit)}")
        self.connection.execute(f"SET temp_directory = {literal(str(self.spill_directory))}")
        if self.settings.threads is not None:
            self.connection.execute(f"SET threads = {int(self.settings.threads)}")

    def close(self) -> None:
        self.connection.close()
        if self._own_spill:
            shutil.rmtree(self.spill_directory, ignore_errors=True)

    def __enter__(self) -> TraceSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def execute(self, sql: str, what: str, params: Sequence[Any] | None = None) -> None:
        """Runs a statement; engine errors become ``ValueError`` naming ``what`` was read."""
        with engine_errors(what):
            self.connection.execute(sql, params or [])

    def fetch(self, sql: str, what: str, params: Sequence[Any] | None = None) -> dict[str, npt.NDArray[Any]]:
        """A query's result as columns (numpy arrays; NULL floats as NaN)."""
        with engine_errors(what):
            result = self.connection.execute(sql, params or []).fetchnumpy()
        return {name: _filled(values) for name, values in result.items()}

    def column_types(self, source: str, what: str) -> dict[str, DuckDBPyType]:
        """The columns a source offers, by name."""
        with engine_errors(what):
            relation = self.connection.sql(f"SELECT * FROM {source} LIMIT 0")
            return dict(zip(relation.columns, relation.types, strict=True))

    def register(self, name: str, columns: Mapping[str, npt.NDArray[Any]]) -> None:
        """Numpy columns as a view (NaN reads as NULL)."""
        self.connection.register(name, dict(columns))


@contextmanager
def engine_errors(what: str) -> Iterator[None]:
    try:
        yield
    except duckdb.Error as error:
        lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
        message = lines[0] if lines else type(error).__name__
        files = [line.removeprefix("file = ").strip() for line in lines if line.startswith("file = ")]
        if files:
            message += f" (in {files[0]})"
        raise ValueError(f"{what}: {message}") from error


def field_expression(types: Mapping[str, DuckDBPyType], *candidates: tuple[str, ...]) -> str | None:
    """The first present of several spellings of one field, coalesced: ``("average_usage", "cpus")``
    is a nested struct field, ``("average_usage_cpus",)`` a flat column. ``None`` when none is present."""
    present: list[str] = []
    for path in candidates:
        column = types.get(path[0])
        if column is None:
            continue
        if len(path) == 1:
            present.append(quoted(path[0]))
            continue
        if column.id == "struct" and path[1] in {name for name, _ in column.children}:
            present.append(f"{quoted(path[0])}.{quoted(path[1])}")
    if not present:
        return None
    return present[0] if len(present) == 1 else f"coalesce({', '.join(present)})"
