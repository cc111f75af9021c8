"""The synthetic Autopilot workload and the per-task signal types it shares with the trace readers."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from cellpilot.job_vocabulary import AppClass
from cellpilot.workloads.autopilot_jobs import (
    AutopilotWorkloadConfig,
    generate_job,
    generate_jobs,
    generate_task_signals,
    task_counts,
)
from cellpilot.workloads.task_signals import (
    WINDOWS_PER_DAY,
    JobSignals,
    JobTraits,
    TaskSignal,
    group_tasks,
    stack_tasks,
)

SMALL = AutopilotWorkloadConfig(jobs=24, days=2, seed=3, max_tasks=40)


def _arrays(job: JobSignals) -> list[np.ndarray]:
    return [job.memory_mean, job.memory_peak, job.cpu_mean, job.memory_limit_hard, job.restart]


def test_a_job_depends_only_on_seed_and_index() -> None:
    alone = generate_job(SMALL, 7)
    in_order = list(generate_jobs(SMALL, range(5, 9)))[2]
    for a, b in zip(_arrays(alone), _arrays(in_order), strict=True):
        np.testing.assert_array_equal(a, b)
    other_seed = generate_job(dataclasses.replace(SMALL, seed=4), 7)
    assert not np.array_equal(alone.memory_mean, other_seed.memory_mean, equal_nan=True)


def test_task_counts_match_generated_jobs_and_bounds() -> None:
    counts = task_counts(SMALL)
    jobs = list(generate_jobs(SMALL))
    assert counts == [j.tasks for j in jobs]
    assert all(1 <= n <= SMALL.max_tasks for n in counts)


def test_population_mixes_classes_leaks_and_sizes() -> None:
    config = AutopilotWorkloadConfig(jobs=600, days=1, seed=5, with_cpu=False)
    counts = task_counts(config)  # 1 % of jobs have a thousand tasks or more
    assert min(counts) == 1
    assert max(counts) >= 1000
    kinds = {generate_job(dataclasses.replace(config, max_tasks=4), j).traits.kind for j in range(60)}
    assert {"serving", "batch", "serving-leak"} <= kinds


@pytest.mark.parametrize("job", range(12), ids=lambda j: f"job{j}")
def test_manual_limits_are_round_and_hard_ones_cover_the_first_day_peak(job: int) -> None:
    signals = generate_job(SMALL, job)
    hard = float(np.nanmax(signals.memory_limit_hard))
    soft = float(np.nanmax(signals.memory_limit_soft))
    for limit in (hard, soft):
        step = 2.0 ** (np.floor(np.log2(limit)) - 3)
        assert limit / step == pytest.approx(round(limit / step))  # eight steps per power of two
    first_day = signals.memory_peak[:WINDOWS_PER_DAY].astype(np.float64)
    leak = signals.memory_leak_per_window.astype(np.float64)
    # Leak growth up to the first day's end (no restart can make it larger).
    bound = np.nanmax(first_day + leak[None, :] * np.arange(WINDOWS_PER_DAY)[:, None])
    assert hard >= 1.05 * np.nanmax(first_day) * (1 - 1e-6)
    assert hard >= 1.05 * min(bound, np.nanmax(first_day)) * (1 - 1e-6)
    assert np.all(np.isnan(signals.memory_limit_hard) == ~signals.running)


def test_manual_slack_on_the_first_day_is_calibrated_to_the_paper() -> None:
    """§4.2: manual relative slack averages ~60 % (hard RAM limits) and ~46 % (soft)."""
    config = AutopilotWorkloadConfig(jobs=80, days=1, seed=9, max_tasks=20, with_cpu=False)
    hard, soft = [], []
    for job in generate_jobs(config):
        usage = np.percentile(job.memory_mean[job.running], 95)  # §4.1.1's usage, by brute force
        hard.append(1 - usage / np.nanmean(job.memory_limit_hard[job.running]))
        soft.append(1 - usage / np.nanmean(job.memory_limit_soft[job.running]))
    assert 0.55 <= np.mean(hard) <= 0.72
    assert 0.38 <= np.mean(soft) <= 0.56
    assert np.mean(hard) > np.mean(soft)


def test_batch_jobs_restart_instances_and_serving_jobs_restart_at_rollouts() -> None:
    config = AutopilotWorkloadConfig(jobs=60, days=3, seed=2, max_tasks=6, batch_fraction=0.5)
    batch = [j for j in generate_jobs(config) if j.traits.job_class is AppClass.BATCH]
    assert batch
    for job in batch:
        starts = job.running & ~np.vstack([np.zeros((1, job.tasks), bool), job.running[:-1]])
        # Every instance start (after window 0) is flagged as a restart.
        assert np.all(job.restart[1:][starts[1:]])
        assert np.all(job.memory_leak_per_window == 0)


def test_task_signals_round_trip_through_group_tasks() -> None:
    jobs = list(generate_jobs(dataclasses.replace(SMALL, jobs=5)))
    traits = {j.job_id: j.traits for j in jobs}
    regrouped = group_tasks(
        generate_task_signals(dataclasses.replace(SMALL, jobs=5)), traits, jobs[0].windows
    )
    assert [j.job_id for j in regrouped] == [j.job_id for j in jobs]
    for a, b in zip(jobs, regrouped, strict=True):
        for x, y in zip(_arrays(a), _arrays(b), strict=True):
            np.testing.assert_array_equal(x, y)


def _task(first: int, mean: list[float], limit: list[float], task: int = 0) -> TaskSignal:
    n = len(mean)
    return TaskSignal(
        job_id=1,
        task_index=task,
        first_window=first,
        memory_mean=np.array(mean),
        memory_peak=np.array(mean),
        cpu_mean=np.zeros(n),
        cpu_peak=np.zeros(n),
        memory_limit=np.array(limit),
        cpu_limit=np.full(n, np.nan),
    )


@pytest.mark.parametrize(
    ("tasks", "expected"),
    [
        ([_task(0, [1, 1, 1, 1], [np.nan, 5, np.nan, 7])], [[5], [5], [5], [7]]),
        ([_task(1, [1, 1], [4, np.nan])], [[np.nan], [4], [4], [np.nan]]),
        (
            [_task(0, [1, 1, 1, 1], [np.nan] * 4), _task(0, [1, 1, 1, 1], [6, 6, 8, 8], task=1)],
            [[7, 6], [7, 6], [7, 8], [7, 8]],
        ),
    ],
    ids=["forward-and-back-fill", "offset-task", "job-median"],
)
def test_stack_tasks_fills_missing_limits(tasks: list[TaskSignal], expected: list[list[float]]) -> None:
    job = stack_tasks(1, JobTraits(), tasks, windows=4)
    assert job is not None
    np.testing.assert_array_equal(job.memory_limit_hard, np.array(expected, dtype=np.float32))


def test_stack_tasks_drops_jobs_without_usage_or_limits() -> None:
    assert stack_tasks(1, JobTraits(), [_task(0, [np.nan, np.nan], [1, 1])], windows=2) is None
    assert stack_tasks(1, JobTraits(), [_task(0, [1.0, 1.0], [np.nan, np.nan])], windows=2) is None
