"""Readers of the public Google traces (2011 v2.1 CSV, 2019 v3 JSON) and the committed sample traces."""

from __future__ import annotations

import dataclasses
import gzip
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from cellpilot.job_vocabulary import AppClass, LatencySensitivity
from cellpilot.traces.google import (
    build_tasks,
    parse_google2011_task_events,
    parse_google2011_task_usage,
    parse_google2019_instance_events,
    parse_google2019_instance_usage,
    read_google2011,
    read_google2019,
)
from cellpilot.units import GIB
from cellpilot.workloads.autopilot_jobs import AutopilotWorkloadConfig, generate_jobs
from cellpilot.workloads.google_trace_lines import google2011_lines, google2019_lines
from cellpilot.workloads.google_traces import TRACE_START_US, EventRows, MachineScale
from cellpilot.workloads.task_signals import WINDOWS_PER_DAY

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "libs" / "cellpilot" / "workloads" / "data"
SCALE = MachineScale(memory_bytes=100 * GIB, cpu_millicores=10_000.0)
W = 300_000_000  # one window in µs
T0 = TRACE_START_US


def usage_2011(
    start: int, end: int, job: int, task: int, cpu: str, mem: str, peak_mem: str, peak_cpu: str
) -> str:
    # start, end, job, task, machine, cpu rate, canonical mem, assigned mem, unmapped cache,
    # total cache, max mem, disk io, disk space, max cpu, max disk io, cpi, mai, portion, agg, sampled cpu
    return f"{start},{end},{job},{task},7,{cpu},{mem},0.5,0,0,{peak_mem},0,0,{peak_cpu},0,,,1,0,0.01"


def event_2011(
    time: int, job: int, task: int, kind: int, priority: int, klass: int, cpu: str, mem: str
) -> str:
    return f"{time},,{job},{task},7,{kind},user,{klass},{priority},{cpu},{mem},0,0"


def test_2011_rows_of_one_window_merge_time_weighted_and_requests_become_limits() -> None:
    job = 6_251_812_952  # a real-sized 2011 job id (beyond 32 bits)
    usage = [
        usage_2011(T0, T0 + W // 2, job, 0, "0.02", "0.01", "0.012", "0.05"),
        usage_2011(T0 + W // 2, T0 + W, job, 0, "0.04", "0.03", "0.035", "0.06"),
        usage_2011(T0 + W, T0 + 2 * W, job, 0, "0.03", "0.02", "", "0.04"),  # no max memory
        usage_2011(T0 + 2 * W, T0 + 3 * W, job, 0, "0.03", "0.02", "0.025", "0.04"),
    ]
    events = [
        event_2011(T0 - 10, job, 0, 0, 10, 3, "0.1", "0.04"),
        event_2011(T0 + 2 * W + 5, job, 0, 8, 10, 3, "", "0.05"),  # an update: memory only
    ]
    trace = build_tasks(
        parse_google2011_task_usage(usage), parse_google2011_task_events(events), SCALE, "google2011"
    )
    assert trace.windows == 3
    assert trace.origin_us == T0
    (task,) = trace.tasks
    g = SCALE.memory_bytes
    np.testing.assert_allclose(task.memory_mean, np.array([0.02, 0.02, 0.02]) * g, rtol=1e-6)
    np.testing.assert_allclose(task.memory_peak, np.array([0.035, np.nan, 0.025]) * g, rtol=1e-6)
    np.testing.assert_allclose(task.cpu_mean, np.array([0.03, 0.03, 0.03]) * SCALE.cpu_millicores, rtol=1e-6)
    np.testing.assert_allclose(task.memory_limit, np.array([0.04, 0.04, 0.05]) * g, rtol=1e-6)
    np.testing.assert_allclose(task.cpu_limit, np.full(3, 0.1 * SCALE.cpu_millicores), rtol=1e-6)
    traits = trace.traits[job]
    assert traits.job_class is AppClass.LATENCY_SENSITIVE
    assert traits.latency is LatencySensitivity.HIGH
    (stacked,) = trace.jobs(min_coverage=1.0)
    # A window without a recorded peak uses its mean.
    assert stacked.memory_peak[1, 0] == pytest.approx(0.02 * g, rel=1e-6)


@pytest.mark.parametrize(
    ("priority", "expected"),
    [
        (0, AppClass.BATCH),
        (8, AppClass.BATCH),
        (9, AppClass.LATENCY_SENSITIVE),
        (11, AppClass.LATENCY_SENSITIVE),
    ],
    ids=["free", "middle", "production", "monitoring"],
)
def test_2011_production_priorities_are_serving(priority: int, expected: AppClass) -> None:
    usage = [usage_2011(T0, T0 + W, 5, 0, "0.01", "0.01", "0.01", "0.01")]
    events = [event_2011(T0, 5, 0, 0, priority, 0, "0.1", "0.1")]
    trace = build_tasks(
        parse_google2011_task_usage(usage), parse_google2011_task_events(events), SCALE, "google2011"
    )
    assert trace.traits[5].job_class is expected


def _usage_2019(start: int, **overrides: object) -> str:
    record: dict[str, object] = {
        "start_time": str(start),
        "end_time": str(start + W),
        "collection_id": "400000000001",
        "instance_index": 2,
        "collection_type": 0,
        "average_usage": {"cpus": 0.02, "memory": 0.01},
        "maximum_usage": {"cpus": 0.05, "memory": 0.015},
        "random_sample_usage": {"cpus": 0.03},
        "assigned_memory": 0.03,
        "cpu_usage_distribution": [0.01 * i for i in range(11)],
        "tail_cpu_usage_distribution": [0.1] * 9,
    }
    record.update(overrides)
    return json.dumps(record)


def test_2019_rows_parse_nested_and_flat_fields_and_skip_alloc_sets() -> None:
    flat = json.loads(_usage_2019(T0 + W))
    flat.pop("average_usage")
    flat["average_usage_memory"] = 0.012
    flat["average_usage_cpus"] = 0.021
    lines = [
        _usage_2019(T0),
        json.dumps(flat),
        _usage_2019(T0, collection_type=1, collection_id="9"),  # an alloc set: skipped
        _usage_2019(T0 + 2 * W, cpu_usage_distribution=[0.1, 0.2]),  # not deciles: dropped
    ]
    rows = parse_google2019_instance_usage(lines)
    assert len(rows) == 3
    np.testing.assert_allclose(rows.memory_mean, [0.01, 0.012, 0.01])
    np.testing.assert_allclose(rows.cpu_mean, [0.02, 0.021, 0.02])
    assert rows.cpu_deciles is not None
    np.testing.assert_allclose(rows.cpu_deciles[0], np.arange(11) * 0.01)
    assert np.isnan(rows.cpu_deciles[2]).all()
    trace = build_tasks(rows, EventRows.empty(), SCALE, "google2019")
    (task,) = trace.tasks
    assert task.job_id == 400_000_000_001
    assert task.task_index == 2
    # Without instance events, the assigned memory is the limit.
    np.testing.assert_allclose(task.memory_limit, np.full(3, 0.03 * SCALE.memory_bytes), rtol=1e-6)
    assert task.cpu_deciles is not None
    np.testing.assert_allclose(task.cpu_deciles[0], np.arange(11) * 0.01 * SCALE.cpu_millicores, rtol=1e-6)
    assert np.isnan(task.cpu_deciles[2]).all()


def test_2019_events_set_requests_and_traits() -> None:
    events = [
        json.dumps(
            {
                "time": str(T0),
                "type": 0,
                "collection_id": "400000000001",
                "instance_index": 2,
                "priority": 200,
                "scheduling_class": 1,
                "resource_request": {"cpus": 0.1, "memory": 0.05},
            }
        )
    ]
    trace = build_tasks(
        parse_google2019_instance_usage([_usage_2019(T0)]),
        parse_google2019_instance_events(events),
        SCALE,
        "google2019",
    )
    (task,) = trace.tasks
    assert task.memory_limit[0] == pytest.approx(0.05 * SCALE.memory_bytes, rel=1e-6)
    assert trace.traits[400_000_000_001].job_class is AppClass.LATENCY_SENSITIVE


@pytest.mark.parametrize("trace", ["google2011", "google2019"])
def test_generated_jobs_round_trip_through_the_trace_formats(trace: str) -> None:
    config = AutopilotWorkloadConfig(jobs=4, days=1, seed=8, max_tasks=3)
    jobs = list(generate_jobs(config))
    jobs = [dataclasses.replace(j, job_id=1_000 + j.job_id) for j in jobs]
    if trace == "google2011":
        usage, events = google2011_lines(jobs, SCALE)
        parsed = build_tasks(
            parse_google2011_task_usage(usage), parse_google2011_task_events(events), SCALE, trace
        )
    else:
        usage, events = google2019_lines(jobs, SCALE)
        parsed = build_tasks(
            parse_google2019_instance_usage(usage), parse_google2019_instance_events(events), SCALE, trace
        )
    read = {j.job_id: j for j in parsed.jobs(min_coverage=0.0)}
    for job in jobs:
        got = read[job.job_id]
        offset = (parsed.origin_us - TRACE_START_US) // W
        window = slice(offset, offset + got.windows)
        for name in ("memory_mean", "memory_peak", "cpu_mean", "memory_limit_hard"):
            want = getattr(job, name)[window][:, : got.tasks]
            np.testing.assert_allclose(getattr(got, name), want, rtol=2e-3, err_msg=name)
        assert got.traits.job_class is job.traits.job_class


def test_committed_sample_traces_read_and_filter_short_jobs() -> None:
    for reader, name in ((read_google2011, "google2011_sample"), (read_google2019, "google2019_sample")):
        trace = reader(DATA / name)
        assert trace.windows == 3 * WINDOWS_PER_DAY
        long_running = trace.jobs(min_coverage=0.9)
        everything = trace.jobs(min_coverage=0.0)
        assert len(everything) == len(long_running) + 1  # the job that stops after a day
        assert any(j.traits.job_class is AppClass.BATCH for j in long_running)
        # The owner raised the first job's request on day two (an update event).
        first = long_running[0]
        assert first.memory_limit_hard[-1, 0] > first.memory_limit_hard[0, 0]
    assert read_google2019(DATA / "google2019_sample").jobs()[0].cpu_deciles is not None


def test_committed_sample_traces_are_what_the_script_writes() -> None:
    path = ROOT / "infra" / "scripts" / "make_sample_traces.py"
    spec = importlib.util.spec_from_file_location("make_sample_traces", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    files = module.sample_files()
    assert files
    for file, data in files.items():
        assert Path(file).read_bytes() == data, f"{file} is stale: rerun {path}"
        assert len(gzip.decompress(data)) > 0
    assert sum(len(d) for d in files.values()) < 400_000  # small enough for the repository


def test_missing_trace_directory_is_reported(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_google2011(tmp_path)
    with pytest.raises(FileNotFoundError):
        read_google2019(tmp_path)
