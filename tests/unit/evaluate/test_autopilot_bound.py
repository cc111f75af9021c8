"""The clairvoyant bound: no OOM for its limit, relative slack >= 0, below the peak only where the
machine has room."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from cellpilot.evaluate.autopilot_deciders import parse_recommenders
from cellpilot.evaluate.autopilot_replay import ReplayConfig, replay_chunk, run_study
from cellpilot.evaluate.replay_machines import CELL_MODELS, CellModel
from cellpilot.units import GIB
from cellpilot.workloads.autopilot_jobs import AutopilotWorkloadConfig, generate_job
from cellpilot.workloads.task_signals import WINDOWS_PER_DAY, JobSignals, JobTraits

T = 2 * WINDOWS_PER_DAY


def bursty_job(mean: float, peak: float) -> JobSignals:
    """One task whose every window averages ``mean`` and peaks at ``peak``, manual limit 4 GiB."""
    shape = (T, 1)
    return JobSignals(
        job_id=1,
        traits=JobTraits(),
        memory_mean=np.full(shape, mean, dtype=np.float32),
        memory_peak=np.full(shape, peak, dtype=np.float32),
        cpu_mean=np.zeros(shape, dtype=np.float32),
        cpu_peak=np.zeros(shape, dtype=np.float32),
        memory_limit_hard=np.full(shape, 4 * GIB, dtype=np.float32),
        memory_limit_soft=np.full(shape, 4 * GIB, dtype=np.float32),
        cpu_limit=np.full(shape, np.nan, dtype=np.float32),
        restart=np.zeros(shape, dtype=bool),
        memory_leak_per_window=np.zeros(1, dtype=np.float32),
    )


@pytest.mark.parametrize(
    ("spec", "cell", "limit"),
    [
        ("clairvoyant:hard", CellModel(free_fraction=1.0), 2.0),  # a hard limit covers the peak
        ("clairvoyant", CellModel(free_fraction=1.0), 1.0),  # room on the machine: the day's p95
        ("clairvoyant", CellModel(free_fraction=0.0), 2.0),  # alone and short: the peak
    ],
    ids=["hard", "soft-with-room", "soft-short"],
)
def test_the_bound_is_the_least_limit_without_a_kill(spec: str, cell: CellModel, limit: float) -> None:
    config = ReplayConfig(warmup_days=0, cell=cell)
    rows = next(iter(replay_chunk([bursty_job(1 * GIB, 2 * GIB)], parse_recommenders(spec), config).values()))
    assert int(rows.ooms.sum()) == 0
    np.testing.assert_allclose(rows.average_limit, limit * GIB)
    np.testing.assert_allclose(rows.relative_slack, 1.0 - 1.0 / limit)


@pytest.mark.parametrize("cell", list(CELL_MODELS))
@pytest.mark.parametrize("spec", ["clairvoyant", "clairvoyant:hard"])
def test_the_bounds_relative_slack_is_never_negative(cell: str, spec: str) -> None:
    # Diurnal serving jobs, leaks, restarts and batch jobs; pools of 4 jobs share machines.
    workload = AutopilotWorkloadConfig(jobs=8, days=2, seed=5, max_tasks=6, with_cpu=False)
    jobs = [generate_job(workload, j) for j in range(workload.jobs)]
    config = ReplayConfig(warmup_days=0, cell=dataclasses.replace(CELL_MODELS[cell], pool_jobs=4))
    rows = next(iter(replay_chunk(jobs, parse_recommenders(spec), config).values()))
    assert len(rows) == 16
    assert int(rows.ooms.sum()) == 0
    assert np.nanmin(rows.relative_slack) >= -1e-12  # rounding of the day's average limit
    assert np.nanmean(rows.relative_slack) >= 0.0


def test_every_decider_gets_a_slack_ratio_to_the_bound() -> None:
    workload = AutopilotWorkloadConfig(jobs=4, days=3, seed=2, max_tasks=4, with_cpu=False)
    result = run_study(
        workload, parse_recommenders("manual-soft,ml,clairvoyant"), ReplayConfig(warmup_days=1)
    )
    bound = result.summaries["clairvoyant"]
    assert bound["relative_slack_mean"] > 0.0
    assert bound["slack_vs_bound"] == pytest.approx(1.0)
    for name, summary in result.summaries.items():
        expected = summary["relative_slack_mean"] / bound["relative_slack_mean"]
        assert summary["slack_vs_bound"] == pytest.approx(expected), name
        assert "absolute_slack_vs_bound" in summary
