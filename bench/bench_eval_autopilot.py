"""Autopilot replay throughput (Autopilot §4): job-days per CPU-second, batched vs job by job.

A *job-day* here is one day of one job replayed through all five compared limit setters
(manual hard, manual soft, moving window, ML, VPA), including generating the job's usage,
so the figure converts directly into the issue's target: 500 jobs x (14 + 2 warm-up) days
must take under five minutes on two cores.

Both paths replay the same synthetic jobs in one process and their per-job-day results
are checked to agree before anything is reported:

* batched: the replay's normal chunks (up to 64 jobs stacked along the task axis, every
  setter updating all of them with one numpy call per 5-minute window);
* job by job: chunks of one job (what a replay without batching across jobs would do),
  timed on a subset of the jobs.

Times are process CPU seconds (the figure is per core), the best of two runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from bench.harness import Report
from cellpilot.evaluate.autopilot_metrics import JobDays
from cellpilot.evaluate.autopilot_policies import STANDARD_RECOMMENDERS
from cellpilot.evaluate.autopilot_replay import ReplayConfig, StudyResult, run_study
from cellpilot.workloads.autopilot_jobs import AutopilotWorkloadConfig

FIGURES = [
    "eval.autopilot.job_days_per_s",
    "eval.autopilot.per_job_job_days_per_s",
    "eval.autopilot.speedup_vs_per_job",
    "eval.autopilot.study_500x16_projected_s_on_2_cores",
]

JOBS = 48
PER_JOB_JOBS = 8
DAYS = 2  # 1 warm-up + 1 measured
SEED = 20200427
STUDY_JOB_DAYS = 500 * 16  # the study: 500 jobs, 14 measured + 2 warm-up days


def _cpu_best_of(repeats: int, fn: Callable[[], StudyResult]) -> tuple[float, StudyResult]:
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.process_time()
        result = fn()
        best = min(best, time.process_time() - start)
    assert result is not None
    return best, result


def _same_rows(a: JobDays, b: JobDays) -> bool:
    order_a, order_b = np.lexsort((a.day, a.job_id)), np.lexsort((b.day, b.job_id))
    return bool(
        np.array_equal(a.job_id[order_a], b.job_id[order_b])
        and np.allclose(a.relative_slack[order_a], b.relative_slack[order_b], equal_nan=True)
        and np.array_equal(a.ooms[order_a], b.ooms[order_b])
    )


def run(report: Report) -> None:
    specs = tuple(STANDARD_RECOMMENDERS.values())
    config = ReplayConfig(warmup_days=1, seed=SEED)

    def study(jobs: int, chunk_jobs: int) -> Callable[[], StudyResult]:
        workload = AutopilotWorkloadConfig(jobs=jobs, days=DAYS, seed=SEED)
        return lambda: run_study(workload, specs, config, max_chunk_jobs=chunk_jobs)

    seconds, batched = _cpu_best_of(2, study(JOBS, 64))
    per_job_seconds, per_job = _cpu_best_of(2, study(PER_JOB_JOBS, 1))
    subset = study(PER_JOB_JOBS, 64)()
    for spec in specs:
        if not _same_rows(subset.rows[spec.name], per_job.rows[spec.name]):
            raise AssertionError(f"{spec.name}: batched and job-by-job replays disagree")
    rate = JOBS * DAYS / seconds
    per_job_rate = PER_JOB_JOBS * DAYS / per_job_seconds
    report("eval.autopilot.job_days_per_s", rate, "job-days/s/core")
    report("eval.autopilot.per_job_job_days_per_s", per_job_rate, "job-days/s/core")
    report("eval.autopilot.speedup_vs_per_job", rate / per_job_rate, "x")
    report("eval.autopilot.study_500x16_projected_s_on_2_cores", STUDY_JOB_DAYS / rate / 2, "s")
    del batched
