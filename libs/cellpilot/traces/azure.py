"""Reader for the VM table of the public Azure traces (AzurePublicDataset V1/V2 ``vmtable.csv``).

The table has one row per VM and, without a header, these columns::

    vmid, subscriptionid, deploymentid, vmcreated, vmdeleted, maxcpu, avgcpu,
    p95maxcpu, vmcategory, vmcorecountbucket, vmmemorybucket

Timestamps are seconds from the trace start; core counts and memory (GB) are
buckets such as ``"24"`` or ``">24"`` (an open bucket is read as twice its bound, a guess).
A first line naming these columns (in any order) is accepted as a header; a Parquet table
names them as columns. The VMs' features for the lifetime model are the category
(Delay-insensitive, Interactive, Unknown), the subscription (as an owner code: the
``max_owners - 1`` most frequent subscriptions, ties in order of first appearance; the rest
share one code) and the shape. VMs still alive at the last timestamp are marked
``censored``. Rows with a missing or unreadable field, a deletion before the creation or
an empty shape are skipped.

Everything runs in the columnar engine (:mod:`cellpilot.traces.engine`): parsing, the
owner ranking and the ordering by creation time (stable: ties keep the table's order);
Python receives the finished columns. :func:`read_azure_vm_table` reads ``.csv``,
``.csv.gz`` or ``.parquet``; :func:`parse_azure_vm_table` reads CSV lines.
"""

from __future__ import annotations

import csv
import gzip
import tempfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from cellpilot.lifetimes.vm_table import VmTrace
from cellpilot.traces.engine import (
    EngineSettings,
    TraceSession,
    csv_source,
    parquet_source,
    quoted,
)

COLUMNS = (
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
# The trace samples every 5 minutes: a VM whose deletion is within one sample of the end
# was still running when the trace stopped.
SAMPLE_SECONDS = 300.0


def _first_row(path: Path) -> list[str]:
    """The first non-blank CSV row of a (possibly gzip) file."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", newline="", encoding="utf-8") as handle:  # type: ignore[operator]
        for row in csv.reader(line for line in handle if line.strip()):
            return [cell.strip() for cell in row]
    return []


def _bucket(text: str) -> str:
    t = f"trim(CAST({text} AS VARCHAR))"
    return (
        f"CASE WHEN starts_with({t}, '>') THEN 2 * TRY_CAST(trim(substr({t}, 2)) AS DOUBLE) "
        f"ELSE TRY_CAST({t} AS DOUBLE) END"
    )


def _number(text: str) -> str:
    return f"TRY_CAST(trim(CAST({text} AS VARCHAR)) AS DOUBLE)"


def _read(
    session: TraceSession, source: str, names: dict[str, str], skip_first: bool, max_owners: int, what: str
) -> VmTrace:
    """``names``: each table column's name in ``source``; ``skip_first``: the first row is a header."""
    col = {name: quoted(names[name]) for name in COLUMNS}
    codes = " ".join(f"WHEN '{name.lower()}' THEN {i}" for i, name in enumerate(CATEGORY_NAMES))
    session.execute(f"CREATE TABLE vm_rows AS SELECT * FROM {source}", what)
    session.execute(
        f"""CREATE TABLE vms AS SELECT * FROM (
                SELECT rowid AS seq,
                       coalesce(trim(CAST({col["subscriptionid"]} AS VARCHAR)), '') AS subscription,
                       {_number(col["vmcreated"])} AS created,
                       {_number(col["vmdeleted"])} AS deleted,
                       {_bucket(col["vmcorecountbucket"])} AS cores,
                       {_bucket(col["vmmemorybucket"])} AS memory_gib,
                       CASE lower(trim(CAST({col["vmcategory"]} AS VARCHAR))) {codes}
                           ELSE {len(CATEGORY_NAMES) - 1} END AS category
                FROM vm_rows WHERE rowid >= {int(skip_first)})
            WHERE created IS NOT NULL AND deleted IS NOT NULL AND cores IS NOT NULL AND memory_gib IS NOT NULL
              AND deleted >= created AND cores > 0 AND memory_gib > 0""",
        what,
    )
    # Owner codes: the most frequent subscriptions (ties: first seen first) keep their own.
    got = session.fetch(
        """SELECT created, deleted, cores, memory_gib, category, least(rank, ?) AS owner,
                  max(deleted) OVER () AS horizon
           FROM vms JOIN (SELECT subscription,
                                 row_number() OVER (ORDER BY count(*) DESC, min(seq)) - 1 AS rank
                          FROM vms GROUP BY subscription) USING (subscription)
           ORDER BY created, seq""",
        what,
        [max(max_owners - 1, 1)],
    )
    n = int(got["created"].shape[0])
    if n == 0:
        raise ValueError(f"{what}: no VM rows in the Azure table")
    horizon = float(got["horizon"][0])
    deleted = got["deleted"].astype(np.float64)
    return VmTrace(
        vm_id=np.arange(n, dtype=np.int64),
        created=got["created"].astype(np.float64),
        deleted=deleted,
        cores=got["cores"].astype(np.float64),
        memory_gib=got["memory_gib"].astype(np.float64),
        ssd_gib=np.zeros(n),
        category=got["category"].astype(np.int64),
        owner=got["owner"].astype(np.int64),
        zone=np.zeros(n, dtype=np.int64),
        tier=np.zeros(n, dtype=np.int64),
        horizon=horizon,
        censored=deleted >= horizon - SAMPLE_SECONDS,
        category_names=CATEGORY_NAMES,
        tier_names=("standard",),
        source="azure",
    )


def _read_csv(path: Path, max_owners: int, settings: EngineSettings | None, what: str) -> VmTrace:
    first = _first_row(path)
    header = {cell.lower() for cell in first} >= set(COLUMNS)
    names = [cell.lower() for cell in first] if header else list(COLUMNS)
    # Positional columns (a header's duplicate or blank names get their own).
    positional = [f"c{i}" for i in range(max(len(names), len(COLUMNS)))]
    where = {name: positional[names.index(name)] for name in COLUMNS}
    with TraceSession(settings) as session:
        source = csv_source([path], dict.fromkeys(positional, "VARCHAR"))
        return _read(session, source, where, header, max_owners, what)


def read_azure_vm_table(
    path: str | Path, max_owners: int = 256, *, settings: EngineSettings | None = None
) -> VmTrace:
    """Reads ``vmtable.csv``, ``vmtable.csv.gz`` or a Parquet table with the same columns."""
    path = Path(path)
    what = f"Azure VM table {path}"
    if not path.is_file():
        raise FileNotFoundError(f"{what}: no such file")
    if path.name.endswith(".parquet"):
        with TraceSession(settings) as session:
            source = parquet_source([path])
            present = {name.lower(): name for name in session.column_types(source, what)}
            missing = [name for name in COLUMNS if name not in present]
            if missing:
                raise ValueError(f"{what}: no column {', '.join(missing)}")
            trace = _read(session, source, present, False, max_owners, what)
    else:
        trace = _read_csv(path, max_owners, settings, what)
    return VmTrace(**{**trace.__dict__, "source": f"azure:{path.name}"})


def parse_azure_vm_table(lines: Iterable[str], max_owners: int = 256) -> VmTrace:
    """Parses CSV lines of an Azure VM table (through the same engine, via a temporary file)."""
    with tempfile.TemporaryDirectory(prefix="cellpilot-lines-") as folder:
        path = Path(folder) / "vmtable.csv"
        with path.open("w", encoding="utf-8") as handle:
            for line in lines:
                handle.write(line if line.endswith("\n") else line + "\n")
        return _read_csv(path, max_owners, None, "Azure VM table")
