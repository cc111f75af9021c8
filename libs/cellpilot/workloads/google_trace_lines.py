"""Job signals written as Google trace rows (2011 v2.1 CSV, 2019 v3 JSON): lines out, no I/O.

The inverse of :mod:`cellpilot.workloads.google_traces`, for making small sample traces from
the synthetic generator (``infra/scripts/make_sample_traces.py``) and for round-trip tests.
Values are normalised by a :class:`~cellpilot.workloads.google_traces.MachineScale` and
written with four significant digits, as the public 2011 trace carries. Each task gets a
submit event with its first requests and an update event whenever its requests change;
usage rows cover whole 5-minute windows starting at trace time 600 s.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import numpy as np

from cellpilot.job_vocabulary import AppClass, LatencySensitivity
from cellpilot.workloads.google_traces import (
    PRODUCTION_PRIORITY,
    TRACE_START_US,
    WINDOW_US,
    MachineScale,
)
from cellpilot.workloads.task_signals import CPU_DECILES, JobSignals

# Event types: 2011 SUBMIT = 0, UPDATE_RUNNING = 8; 2019 SUBMIT = 0, UPDATE_RUNNING = 10.
_SUBMIT = 0
_UPDATE_2011 = 8
_UPDATE_2019 = 10


def _g(value: float) -> str:
    return "" if not np.isfinite(value) else f"{value:.4g}"


def _priority(job: JobSignals, trace: str) -> int:
    serving = job.traits.job_class is AppClass.LATENCY_SENSITIVE
    return PRODUCTION_PRIORITY[trace] + (0 if serving else -5)


def _scheduling_class(job: JobSignals) -> int:
    return 3 if job.traits.latency is LatencySensitivity.HIGH else 1


def _request_changes(job: JobSignals, task: int) -> list[tuple[int, float, float]]:
    """(window, memory, cpu) where the task's manual requests are first known or change."""
    running = job.running[:, task]
    rows = np.flatnonzero(running)
    out: list[tuple[int, float, float]] = []
    last: tuple[float, float] | None = None
    for w in rows.tolist():
        current = (float(job.memory_limit_hard[w, task]), float(job.cpu_limit[w, task]))
        if current != last:
            out.append((w, *current))
            last = current
    return out


def _deciles(mean: float, peak: float) -> list[float]:
    """A within-window CPU distribution with the given mean and maximum (for sample data)."""
    if not np.isfinite(mean) or mean <= 0.0:
        return [0.0] * CPU_DECILES
    peak = max(peak, mean)
    shape = np.linspace(0.0, 1.0, CPU_DECILES) ** 3  # most samples low, a tail up to the peak
    low = max(0.0, (mean - peak * shape[1:].mean()) / (1.0 - shape[1:].mean()))
    values = low + (peak - low) * shape
    return [float(f"{v:.4g}") for v in values]


def google2011_lines(jobs: Iterable[JobSignals], scale: MachineScale) -> tuple[list[str], list[str]]:
    """(task_usage lines, task_events lines) in the 2011 v2.1 column order."""
    usage: list[str] = []
    events: list[str] = []
    for job in jobs:
        priority, klass = _priority(job, "google2011"), _scheduling_class(job)
        for task in range(job.tasks):
            for n, (w, memory, cpu) in enumerate(_request_changes(job, task)):
                time_us = TRACE_START_US + w * WINDOW_US
                kind = _SUBMIT if n == 0 else _UPDATE_2011
                events.append(
                    f"{time_us},,{job.job_id},{task},,{kind},user,{klass},{priority},"
                    f"{_g(cpu / scale.cpu_millicores)},{_g(memory / scale.memory_bytes)},,0"
                )
            for w in np.flatnonzero(job.running[:, task]).tolist():
                start = TRACE_START_US + w * WINDOW_US
                mm = job.memory_mean[w, task] / scale.memory_bytes
                mp = job.memory_peak[w, task] / scale.memory_bytes
                cm = job.cpu_mean[w, task] / scale.cpu_millicores
                cp = job.cpu_peak[w, task] / scale.cpu_millicores
                assigned = job.memory_limit_hard[w, task] / scale.memory_bytes
                usage.append(
                    f"{start},{start + WINDOW_US},{job.job_id},{task},1,{_g(cm)},{_g(mm)},{_g(assigned)},"
                    f"0,0,{_g(mp)},0,0,{_g(cp)},0,,,1,0,{_g(0.5 * (cm + cp))}"
                )
    usage.sort(key=lambda line: int(line.split(",", 1)[0]))
    events.sort(key=lambda line: int(line.split(",", 1)[0]))
    return usage, events


def google2019_lines(jobs: Iterable[JobSignals], scale: MachineScale) -> tuple[list[str], list[str]]:
    """(instance_usage lines, instance_events lines) as BigQuery's newline-delimited JSON."""
    usage: list[tuple[int, str]] = []
    events: list[tuple[int, str]] = []
    for job in jobs:
        priority, klass = _priority(job, "google2019"), _scheduling_class(job)
        for task in range(job.tasks):
            for n, (w, memory, cpu) in enumerate(_request_changes(job, task)):
                time_us = TRACE_START_US + w * WINDOW_US
                record = {
                    "time": str(time_us),
                    "type": _SUBMIT if n == 0 else _UPDATE_2019,
                    "collection_id": str(job.job_id),
                    "instance_index": task,
                    "collection_type": 0,
                    "priority": priority,
                    "scheduling_class": klass,
                    "resource_request": {
                        "cpus": float(_g(cpu / scale.cpu_millicores) or 0),
                        "memory": float(_g(memory / scale.memory_bytes) or 0),
                    },
                }
                events.append((time_us, json.dumps(record, separators=(",", ":"))))
            for w in np.flatnonzero(job.running[:, task]).tolist():
                start = TRACE_START_US + w * WINDOW_US
                cm = float(job.cpu_mean[w, task] / scale.cpu_millicores)
                cp = float(job.cpu_peak[w, task] / scale.cpu_millicores)
                record = {
                    "start_time": str(start),
                    "end_time": str(start + WINDOW_US),
                    "collection_id": str(job.job_id),
                    "instance_index": task,
                    "collection_type": 0,
                    "average_usage": {
                        "cpus": float(_g(cm) or 0),
                        "memory": float(_g(job.memory_mean[w, task] / scale.memory_bytes)),
                    },
                    "maximum_usage": {
                        "cpus": float(_g(cp) or 0),
                        "memory": float(_g(job.memory_peak[w, task] / scale.memory_bytes)),
                    },
                    "random_sample_usage": {"cpus": float(_g(0.5 * (cm + cp)) or 0)},
                    "assigned_memory": float(_g(job.memory_limit_hard[w, task] / scale.memory_bytes)),
                    "cpu_usage_distribution": _deciles(cm, cp),
                }
                usage.append((start, json.dumps(record, separators=(",", ":"))))
    usage.sort(key=lambda item: item[0])
    events.sort(key=lambda item: item[0])
    return [line for _, line in usage], [line for _, line in events]
