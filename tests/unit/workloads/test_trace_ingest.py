"""The columnar trace readers give what the row-by-row readers gave, on every input format.

The reference is the former row-by-row implementation, kept only as the benchmark's
baseline (``bench/rowwise_trace_reader.py``, loaded here by path). Compared: the committed
samples, a generated multi-shard trace with split windows, rows without memory, events
tied in time and a shuffled row order, its Parquet conversion, small engine batches, the
engine-side choice of long-running jobs, and the Azure VM table (CSV, gzip, header, Parquet).
"""

from __future__ import annotations

import dataclasses
import gzip
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import duckdb
import numpy as np
import pytest

from cellpilot.lifetimes.vm_table import VmTrace
from cellpilot.traces.azure import read_azure_vm_table
from cellpilot.traces.engine import EngineSettings
from cellpilot.traces.google import open_google_trace, read_google2011, read_google2019
from cellpilot.workloads.autopilot_jobs import AutopilotWorkloadConfig, generate_jobs
from cellpilot.workloads.google_trace_lines import google2011_lines, google2019_lines
from cellpilot.workloads.google_traces import (
    TASK_EVENTS_COLUMNS,
    TASK_USAGE_COLUMNS,
    MachineScale,
    TraceTasks,
)

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "libs" / "cellpilot" / "workloads" / "data"
SCALE = MachineScale()
SERIES = ("memory_mean", "memory_peak", "cpu_mean", "cpu_peak", "memory_limit", "cpu_limit", "cpu_deciles")


def _baseline() -> ModuleType:
    path = ROOT / "bench" / "rowwise_trace_reader.py"
    spec = importlib.util.spec_from_file_location("rowwise_trace_reader", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


ROWWISE = _baseline()


def assert_same_tasks(new: TraceTasks, old: TraceTasks) -> None:
    assert (new.windows, new.origin_us) == (old.windows, old.origin_us)
    assert new.traits == old.traits
    assert len(new.tasks) == len(old.tasks)
    for a, b in zip(new.tasks, old.tasks, strict=True):
        assert (a.job_id, a.task_index, a.first_window) == (b.job_id, b.task_index, b.first_window)
        for name in SERIES:
            x, y = getattr(a, name), getattr(b, name)
            assert (x is None) == (y is None), name
            if x is not None:
                np.testing.assert_array_equal(x, y, err_msg=f"{a.job_id}/{a.task_index} {name}")


@pytest.mark.parametrize(
    ("reader", "baseline", "sample"),
    [
        (read_google2011, "read_google2011_rowwise", "google2011_sample"),
        (read_google2019, "read_google2019_rowwise", "google2019_sample"),
    ],
    ids=["2011", "2019"],
)
def test_committed_samples_read_as_before(reader: Any, baseline: str, sample: str) -> None:
    assert_same_tasks(reader(DATA / sample), getattr(ROWWISE, baseline)(DATA / sample))


def _jobs() -> list[Any]:
    config = AutopilotWorkloadConfig(jobs=9, days=2, seed=5, max_tasks=4)
    return [dataclasses.replace(j, job_id=7_000_000_000 + 13 * j.job_id) for j in generate_jobs(config)]


def _split_2011(line: str, rng: np.random.Generator) -> list[str]:
    """A whole-window row as two part-window rows (a task restarting mid-window), or kept."""
    cells = line.split(",")
    if rng.random() > 0.2:
        return [line]
    start, end = int(cells[0]), int(cells[1])
    middle = start + int(rng.integers(1, end - start))
    first, second = list(cells), list(cells)
    first[1], second[0] = str(middle), str(middle)
    second[5] = f"{float(cells[5] or 0) * 1.5:.4g}"
    second[6] = f"{float(cells[6] or 0) * 0.5:.4g}"
    second[10] = ""  # no recorded peak in that part
    return [",".join(first), ",".join(second)]


def _write_shards(folder: Path, lines: list[str], shards: int, suffix: str) -> None:
    folder.mkdir(parents=True)
    for s in range(shards):
        with gzip.open(folder / f"part-{s:05d}-of-{shards:05d}{suffix}.gz", "wt") as handle:
            handle.write("".join(line + "\n" for line in lines[s::shards]))


def _make_2011(root: Path) -> Path:
    rng = np.random.default_rng(3)
    usage, events = google2011_lines(_jobs(), SCALE)
    usage = [part for line in usage for part in _split_2011(line, rng)]
    job = usage[0].split(",")[2]
    usage.append(
        f"{usage[0].split(',')[0]},{usage[0].split(',')[1]},{job},3,1,0.01,,0.02,0,0,,0,0,0.02,0,,,1,0,0"
    )
    usage.append("")  # a blank line
    rng.shuffle(usage)
    first = events[0].split(",")
    # Two requests of one task at one instant: the later row in the trace holds.
    events.append(",".join([*first[:9], "0.2", "0.3", *first[11:]]))
    events.append(",".join([*first[:9], "0.1", "0.01", *first[11:]]))
    _write_shards(root / "task_usage", usage, 3, ".csv")
    _write_shards(root / "task_events", events, 2, ".csv")
    return root


def _make_2019(root: Path) -> Path:
    rng = np.random.default_rng(4)
    usage, events = google2019_lines(_jobs(), SCALE)
    record = json.loads(usage[0])
    record.pop("average_usage")  # flattened fields, as some exports have
    record["average_usage_memory"], record["average_usage_cpus"] = 0.01, 0.02
    record["cpu_usage_distribution"] = [0.1, 0.2]  # not deciles
    record["instance_index"] = 3
    usage.append(json.dumps(record))
    usage.append(json.dumps({**json.loads(usage[1]), "collection_type": 1, "collection_id": "5"}))
    rng.shuffle(usage)
    _write_shards(root / "instance_usage", usage, 3, ".json")
    _write_shards(root / "instance_events", events, 2, ".json")
    return root


def test_generated_multi_shard_2011_trace_reads_as_before(tmp_path: Path) -> None:
    root = _make_2011(tmp_path / "t2011")
    old = ROWWISE.read_google2011_rowwise(root)
    assert sum(len(t.memory_mean) for t in old.tasks) > 1000
    assert_same_tasks(read_google2011(root), old)
    # Whole jobs per batch, however small the batches: the same tasks.
    assert_same_tasks(read_google2011(root, settings=EngineSettings(batch_rows=7, threads=1)), old)


def test_generated_multi_shard_2019_trace_reads_as_before(tmp_path: Path) -> None:
    root = _make_2019(tmp_path / "t2019")
    assert_same_tasks(read_google2019(root), ROWWISE.read_google2019_rowwise(root))


def _to_parquet(source: Path, target: Path, read: str) -> None:
    """Each shard as a Parquet file (``read``: the table function, ``{path}`` for the shard)."""
    target.mkdir(parents=True)
    for shard in sorted(source.iterdir()):
        out = target / (shard.name.split(".")[0] + ".parquet")
        duckdb.sql("SELECT * FROM " + read.replace("{path}", str(shard))).write_parquet(str(out))


def _typed(columns: tuple[str, ...], integers: tuple[str, ...]) -> str:
    types = {
        name: "BIGINT" if name in integers else "VARCHAR" if name == "user" else "DOUBLE" for name in columns
    }
    return f"read_csv('{{path}}', header=false, auto_detect=false, columns={types})"


def test_parquet_shards_read_as_the_csv_and_json_shards(tmp_path: Path) -> None:
    csv_root = _make_2011(tmp_path / "csv")
    ids = ("start_time", "end_time", "job_id", "task_index", "machine_id", "timestamp")
    _to_parquet(csv_root / "task_usage", tmp_path / "pq2011" / "task_usage", _typed(TASK_USAGE_COLUMNS, ids))
    _to_parquet(
        csv_root / "task_events", tmp_path / "pq2011" / "task_events", _typed(TASK_EVENTS_COLUMNS, ids)
    )
    assert_same_tasks(read_google2011(tmp_path / "pq2011"), read_google2011(csv_root))

    json_root = _make_2019(tmp_path / "json")
    for table in ("instance_usage", "instance_events"):
        read = "read_json('{path}', format='newline_delimited')"
        _to_parquet(json_root / table, tmp_path / "pq2019" / table, read)
    assert_same_tasks(read_google2019(tmp_path / "pq2019"), read_google2019(json_root))


def test_long_running_jobs_are_chosen_in_the_engine(tmp_path: Path) -> None:
    root = _make_2011(tmp_path / "t")
    everything = read_google2011(root)
    for coverage, serving in ((0.0, False), (0.9, False), (0.5, True)):
        expected = everything.jobs(min_coverage=coverage, serving_only=serving)
        with open_google_trace("google2011", root, settings=EngineSettings(batch_rows=50)) as trace:
            streamed = list(trace.jobs(min_coverage=coverage, serving_only=serving))
        assert [j.job_id for j in streamed] == [j.job_id for j in expected]
        for a, b in zip(streamed, expected, strict=True):
            assert a.traits == b.traits
            np.testing.assert_array_equal(a.memory_limit_hard, b.memory_limit_hard)
            np.testing.assert_array_equal(a.memory_peak, b.memory_peak)


def test_malformed_value_names_the_table(tmp_path: Path) -> None:
    folder = tmp_path / "bad" / "task_usage"
    folder.mkdir(parents=True)
    (folder / "part-0.csv").write_text(
        "600000000,900000000,notanumber,0,1,0.1,0.1,0.1,0,0,0.1,0,0,0.1,0,,,1,0,0\n"
    )
    with pytest.raises(ValueError, match="task_usage"):
        read_google2011(tmp_path / "bad")


def _azure_rows(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        created = int(rng.integers(0, 50)) * 300  # many ties in creation time
        deleted = created + int(rng.integers(-300, 20_000))  # some deleted before created: skipped
        cores = rng.choice(["1", "2", "4", ">24", "x", ""])
        memory = rng.choice(["2", "8", ">64", "32"])
        category = rng.choice(["Interactive", "Delay-insensitive", "Unknown", "unknown", ""])
        sub = f"sub-{int(rng.zipf(1.5)) % 40}"
        rows.append(f"vm-{i},{sub},dep,{created},{deleted},90,10,50,{category},{cores},{memory}")
    rows.insert(n // 2, "broken,row")
    return rows


def assert_same_vms(a: VmTrace, b: VmTrace) -> None:
    assert (a.horizon, a.category_names, a.tier_names) == (b.horizon, b.category_names, b.tier_names)
    for name in ("vm_id", "created", "deleted", "cores", "memory_gib", "ssd_gib", "category", "owner",
                 "zone", "tier", "censored"):  # fmt: skip
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


@pytest.mark.parametrize("header", [False, True], ids=["headerless", "header"])
def test_azure_table_reads_as_before(tmp_path: Path, header: bool) -> None:
    rows = _azure_rows(3000, seed=1)
    if header:
        rows.insert(0, "vmcreated,vmid,subscriptionid,deploymentid,vmdeleted,maxcpu,avgcpu,p95maxcpu,"
                       "vmcategory,vmcorecountbucket,vmmemorybucket")  # fmt: skip
        cells = [r.split(",") for r in rows[1:]]
        rows[1:] = [",".join([c[3], *c[:3], *c[4:]]) if len(c) > 4 else ",".join(c) for c in cells]
    packed = tmp_path / "vmtable.csv.gz"
    with gzip.open(packed, "wt") as handle:
        handle.write("\n".join(rows) + "\n")
    new = read_azure_vm_table(packed, max_owners=8)
    assert_same_vms(new, ROWWISE.read_azure_vm_table_rowwise(packed, max_owners=8))
    assert new.source == "azure:vmtable.csv.gz"
    parquet = tmp_path / "vmtable.parquet"
    duckdb.sql(f"SELECT * FROM read_csv('{packed}', header={str(header).lower()}, all_varchar=true, "
               "null_padding=true, names=['vmid','subscriptionid','deploymentid','vmcreated','vmdeleted',"
               "'maxcpu','avgcpu','p95maxcpu','vmcategory','vmcorecountbucket','vmmemorybucket'])"
               ).write_parquet(str(parquet))  # fmt: skip
    if not header:
        assert_same_vms(read_azure_vm_table(parquet, max_owners=8), new)
