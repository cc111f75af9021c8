"""Reader for the VM table of the public Azure traces (AzurePublicDataset V1/V2 ``vmtable.csv``).

The table has one row per VM and, without a header, these columns::

    vmid, subscriptionid, deploymentid, vmcreated, vmdeleted, maxcpu, avgcpu,
    p95maxcpu, vmcategory, vmcorecountbucket, vmmemorybucket

Timestamps are seconds from the trace start; core counts and memory (GB) are
buckets such as ``"24"`` or ``">24"``. A first line naming these columns (in any
order) is accepted as a header. The VMs' features for the lifetime model are the
category (Delay-insensitive, Interactive, Unknown), the subscription (as an owner
code: the ``max_owners - 1`` most frequent subscriptions, the rest share one code)
and the shape. VMs still alive at the last timestamp are marked ``censored``.

:func:`parse_azure_vm_table` is pure (lines in, :class:`VmTrace` out);
:func:`read_azure_vm_table` opens a path (plain or ``.gz``) and calls it.
"""

from __future__ import annotations

import csv
import gzip
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from cellpilot.workloads.vm_trace import VmTrace

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


def bucket_value(text: str) -> float:
    """A bucket label as a number: ``"8"`` -> 8; an open bucket ``">24"`` -> 2 x 24 (a guess)."""
    text = text.strip()
    if text.startswith(">"):
        return 2.0 * float(text[1:])
    return float(text)


def parse_azure_vm_table(lines: Iterable[str], max_owners: int = 256) -> VmTrace:
    """Parses CSV lines of an Azure VM table; rows with missing fields are skipped."""
    rows = csv.reader(line for line in lines if line.strip())
    order = {name: i for i, name in enumerate(COLUMNS)}
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
        if i == 0 and {c.lower() for c in cells} >= set(COLUMNS):
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


def read_azure_vm_table(path: str | Path, max_owners: int = 256) -> VmTrace:
    """Reads ``vmtable.csv`` (or ``vmtable.csv.gz``) from ``path``."""
    path = Path(path)
    if path.suffix == ".gz":
        with gzip.open(path, "rt", newline="") as handle:
            trace = parse_azure_vm_table(handle, max_owners)
    else:
        with path.open(newline="") as handle:
            trace = parse_azure_vm_table(handle, max_owners)
    return VmTrace(**{**trace.__dict__, "source": f"azure:{path.name}"})
