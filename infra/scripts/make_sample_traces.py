"""Writes the small sample traces under ``libs/cellpilot/workloads/data/`` (used by tests and docs).

Usage: ``.venv/bin/python infra/scripts/make_sample_traces.py [--check]``

Both samples come from the synthetic Autopilot workload (``cellpilot.workloads.autopilot_jobs``)
written in the public traces' formats (``cellpilot.workloads.google_trace_lines``):

* ``google2011_sample/task_usage/part-00000-of-00001.csv.gz`` and ``task_events/...``:
  four jobs over three days, 2011 v2.1 CSV;
* ``google2019_sample/instance_usage/part-00000-of-00001.json.gz`` and
  ``instance_events/...``: the same jobs but the three-task serving one (JSON rows are
  larger), as 2019 v3 newline-delimited JSON.

The jobs: two serving jobs, a batch job and a serving job that stops after its first day
(to exercise the long-running filter), with one task's memory request raised on day two
(an update event). Trace job ids are large, as in the real traces. Files are written with
gzip's mtime set to 0, so running the script twice gives identical bytes; ``--check``
fails if the committed files differ from what the script would write.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import io
import sys
from pathlib import Path

import numpy as np

from cellpilot.job_vocabulary import AppClass
from cellpilot.workloads.autopilot_jobs import AutopilotWorkloadConfig, generate_job
from cellpilot.workloads.google_trace_lines import google2011_lines, google2019_lines
from cellpilot.workloads.google_traces import MachineScale
from cellpilot.workloads.task_signals import WINDOWS_PER_DAY, JobSignals

DATA = Path(__file__).resolve().parents[2] / "libs" / "cellpilot" / "workloads" / "data"
SAMPLE_CONFIG = AutopilotWorkloadConfig(jobs=12, days=3, seed=11, task_mixture=((1.0, 1, 3),), max_tasks=3)
JOB_ID_BASE = 6_251_000_000
SCALE = MachineScale()


def sample_jobs() -> list[JobSignals]:
    """The four sample jobs (deterministic)."""
    jobs = [generate_job(SAMPLE_CONFIG, j) for j in range(SAMPLE_CONFIG.jobs)]
    serving = [j for j in jobs if j.traits.job_class is AppClass.LATENCY_SENSITIVE][:3]
    batch = [j for j in jobs if j.traits.job_class is AppClass.BATCH][:1]
    chosen = serving[:2] + batch + serving[2:3]
    out: list[JobSignals] = []
    for n, job in enumerate(chosen):
        limit = job.memory_limit_hard.copy()
        if n == 0:  # the owner raises task 0's request at the start of day two
            limit[WINDOWS_PER_DAY:, 0] = np.where(
                np.isnan(limit[WINDOWS_PER_DAY:, 0]), np.nan, limit[WINDOWS_PER_DAY:, 0] * 1.25
            )
        mean = job.memory_mean.copy()
        if n == 3:  # a job that stops after its first day
            mean[WINDOWS_PER_DAY:] = np.nan
        out.append(
            dataclasses.replace(
                job,
                job_id=JOB_ID_BASE + n,
                memory_mean=mean,
                memory_limit_hard=limit,
                memory_limit_soft=limit,
            )
        )
    return out


def _gzip(lines: list[str]) -> bytes:
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0, compresslevel=9) as handle:
        handle.write(("\n".join(lines) + "\n").encode())
    return buffer.getvalue()


def sample_files() -> dict[Path, bytes]:
    jobs = sample_jobs()
    usage_2011, events_2011 = google2011_lines(jobs, SCALE)
    usage_2019, events_2019 = google2019_lines([jobs[0], *jobs[2:]], SCALE)
    part_csv, part_json = "part-00000-of-00001.csv.gz", "part-00000-of-00001.json.gz"
    return {
        DATA / "google2011_sample" / "task_usage" / part_csv: _gzip(usage_2011),
        DATA / "google2011_sample" / "task_events" / part_csv: _gzip(events_2011),
        DATA / "google2019_sample" / "instance_usage" / part_json: _gzip(usage_2019),
        DATA / "google2019_sample" / "instance_events" / part_json: _gzip(events_2019),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed files are stale")
    args = parser.parse_args(argv)
    files = sample_files()
    if args.check:
        stale = [p for p, data in files.items() if not p.exists() or p.read_bytes() != data]
        for path in stale:
            print(f"stale: {path}", file=sys.stderr)
        return 1 if stale else 0
    for path, data in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        print(f"wrote {path} ({len(data) / 1024:.0f} KiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
