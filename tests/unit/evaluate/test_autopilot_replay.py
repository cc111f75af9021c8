"""The replay: actuation delay, hard / soft OOMs on shared machines, restarts and leaks, limit
changes, chunk independence."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cellpilot.evaluate.autopilot_deciders import STANDARD_RECOMMENDERS, parse_recommenders
from cellpilot.evaluate.autopilot_replay import (
    Actuation,
    ReplayConfig,
    cpu_points,
    plan_chunks,
    replay_chunk,
    run_study,
)
from cellpilot.evaluate.replay_machines import CellModel
from cellpilot.units import GIB
from cellpilot.workloads.autopilot_jobs import AutopilotWorkloadConfig, generate_job, task_counts
from cellpilot.workloads.task_signals import WINDOWS_PER_DAY, JobSignals, JobTraits

DAYS = 2
T = DAYS * WINDOWS_PER_DAY
# A whole free 256 GiB machine covers any overage; with none free, a task alone on its machine
# that goes over its soft limit makes the machine short.
NO_PRESSURE = CellModel(free_fraction=1.0)
ALWAYS_SHORT = CellModel(free_fraction=0.0)


def constant_job(
    peaks: list[float],
    limit: float,
    *,
    leak: float = 0.0,
    job_id: int = 1,
    limits: np.ndarray | None = None,
) -> JobSignals:
    """Tasks with constant usage (peak = mean) and a constant manual limit, over DAYS days."""
    n = len(peaks)
    usage = np.tile(np.asarray(peaks, dtype=np.float32), (T, 1))
    lim = np.full((T, n), limit, dtype=np.float32) if limits is None else limits.astype(np.float32)
    return JobSignals(
        job_id=job_id,
        traits=JobTraits(),
        memory_mean=usage,
        memory_peak=usage,
        cpu_mean=np.zeros((T, n), dtype=np.float32),
        cpu_peak=np.zeros((T, n), dtype=np.float32),
        memory_limit_hard=lim,
        memory_limit_soft=lim,
        cpu_limit=np.full((T, n), np.nan, dtype=np.float32),
        restart=np.zeros((T, n), dtype=bool),
        memory_leak_per_window=np.full(n, leak, dtype=np.float32),
    )


def config(**overrides: object) -> ReplayConfig:
    return dataclasses.replace(ReplayConfig(warmup_days=0, restart_seconds=60.0), **overrides)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "model", "ooms_per_day"),
    [
        ("manual-hard", NO_PRESSURE, WINDOWS_PER_DAY),
        ("manual-soft", NO_PRESSURE, 0),
        ("manual-soft", ALWAYS_SHORT, WINDOWS_PER_DAY),
    ],
    ids=["hard-kills", "soft-spared", "soft-under-pressure"],
)
def test_a_task_above_its_limit(name: str, model: CellModel, ooms_per_day: int) -> None:
    # One 2 GiB task under a 1 GiB limit; the owner never reacts (alert threshold out of reach).
    cfg = config(cell=model)
    cfg = dataclasses.replace(cfg, manual_response=dataclasses.replace(cfg.manual_response, alert_ooms=10**9))
    rows = replay_chunk([constant_job([2 * GIB], 1 * GIB)], parse_recommenders(name), cfg)[name]
    assert list(rows.ooms) == [ooms_per_day] * DAYS
    # Each OOM costs a minute of runtime: 288 windows x 4/5 of a window -> 0.8 tasks on average.
    expected_tasks = 1.0 - (60_000 / 300_000) * (ooms_per_day / WINDOWS_PER_DAY)
    np.testing.assert_allclose(rows.tasks, expected_tasks)
    np.testing.assert_allclose(rows.relative_oom_rate, ooms_per_day / expected_tasks)


def test_the_owner_raises_a_hard_limit_after_an_oom_alert() -> None:
    cfg = config(cell=NO_PRESSURE)
    rows = replay_chunk([constant_job([2 * GIB], 1 * GIB)], parse_recommenders("manual-hard"), cfg)[
        "manual-hard"
    ]
    r = cfg.manual_response
    # Alert after `alert_ooms` OOMs (one per window), answered `response_ms` later, applied after
    # the actuation delay: OOMs stop once 1.3 x the limit... and again until it covers 2 GiB.
    assert rows.ooms[0] < WINDOWS_PER_DAY
    assert rows.ooms[1] == 0
    assert rows.limit_changes.sum() >= 1
    assert rows.average_limit[1] >= 2 * GIB
    assert r.raise_factor > 1


def leaking_oom_windows(base: float, leak: float, limit: float, windows: int) -> int:
    """A plain loop: growth adds `leak` per window and resets to zero after each OOM."""
    growth, ooms = 0.0, 0
    for _ in range(windows):
        if base + growth > limit:
            ooms += 1
            growth = 0.0
        else:
            growth += leak
    return ooms


@pytest.mark.parametrize(
    ("base", "leak", "limit"),
    [(1.0, 0.1, 2.05), (1.0, 0.33, 2.0), (1.5, 0.01, 2.0)],  # away from exact float ties
    ids=["ten-steps", "three-steps", "slow"],
)
def test_a_leak_resets_at_each_oom(base: float, leak: float, limit: float) -> None:
    cfg = config(cell=NO_PRESSURE)
    cfg = dataclasses.replace(cfg, manual_response=dataclasses.replace(cfg.manual_response, alert_ooms=10**9))
    job = constant_job([base * GIB], limit * GIB, leak=leak * GIB)
    rows = replay_chunk([job], parse_recommenders("manual-hard"), cfg)["manual-hard"]
    assert int(rows.ooms.sum()) == leaking_oom_windows(base, leak, limit, T)


def test_manual_limit_changes_are_counted_per_day() -> None:
    limits = np.full((T, 2), 4 * GIB)
    limits[100:, 0] = 5 * GIB  # one task changes in window 100 (day 0)
    limits[400:, :] = 6 * GIB  # both change in window 400 (day 1): one change for the job
    job = constant_job([GIB, GIB], 0, limits=limits)
    rows = replay_chunk([job], parse_recommenders("manual-hard"), config())["manual-hard"]
    assert list(rows.limit_changes) == [1, 1]


@pytest.mark.parametrize("delay", [0, 1, 3], ids=["next-window", "one-more", "three-more"])
def test_actuation_applies_a_decision_after_the_delay(delay: int) -> None:
    actuation = Actuation(jobs=1, delay_windows=delay)
    applied = []
    for t in range(8):
        actuation.start_window(t)
        applied.append(actuation.applied[0])
        if t == 2:
            actuation.decide(t, np.array([7.0]))
        else:
            actuation.decide(t, np.array([np.nan]))
    first = 2 + 1 + delay
    assert all(np.isnan(a) for a in applied[:first])
    assert all(a == 7.0 for a in applied[first:])


def test_autopilot_recommenders_size_a_steady_job_and_avoid_its_ooms() -> None:
    job = constant_job([1 * GIB, 1.1 * GIB], 0.5 * GIB)  # the manual limit is far too small
    rows = replay_chunk([job], parse_recommenders("moving-window,ml,vpa"), config(cell=ALWAYS_SHORT))
    for name, r in rows.items():
        # Only the first windows (before a recommendation is in force) can OOM.
        assert r.ooms[1] == 0, name
        # Above the peak; the services' OOM reaction (each kill bumps the limit by 20 % and
        # adds that value to the history) can leave ML well above it, not unboundedly so.
        assert 1.1 * GIB <= r.average_limit[1] <= 2.0 * GIB, name
        assert 0.0 < r.relative_slack[1] < 0.4, name


def test_jobs_on_their_own_machines_replay_the_same_alone_or_together() -> None:
    workload = AutopilotWorkloadConfig(jobs=3, days=2, seed=4, max_tasks=5, with_cpu=False)
    jobs = [generate_job(workload, j) for j in range(3)]
    specs = parse_recommenders("manual-soft,moving-window,ml,vpa")
    cfg = config(cell=CellModel(pool_jobs=1))
    together = replay_chunk(jobs, specs, cfg)
    for job in jobs:
        alone = replay_chunk([job], specs, cfg)
        for name in together:
            mine = together[name].select(together[name].job_id == job.job_id)
            np.testing.assert_array_equal(mine.ooms, alone[name].ooms, err_msg=name)
            np.testing.assert_allclose(mine.footprint, alone[name].footprint, rtol=1e-12, err_msg=name)


def test_a_study_does_not_depend_on_how_pools_are_grouped_into_chunks() -> None:
    workload = AutopilotWorkloadConfig(jobs=6, days=3, seed=4, max_tasks=5, with_cpu=False)
    specs = parse_recommenders("manual-soft,ml")
    cfg = dataclasses.replace(ReplayConfig(warmup_days=1), cell=CellModel(pool_jobs=2))
    one = run_study(workload, specs, cfg, max_chunk_jobs=64)
    many = run_study(workload, specs, cfg, max_chunk_jobs=1)  # one pool per chunk
    for name in one.rows:
        a, b = one.rows[name], many.rows[name]
        ia, ib = np.lexsort((a.day, a.job_id)), np.lexsort((b.day, b.job_id))
        np.testing.assert_array_equal(a.job_id[ia], b.job_id[ib])
        np.testing.assert_array_equal(a.ooms[ia], b.ooms[ib], err_msg=name)
        np.testing.assert_allclose(a.footprint[ia], b.footprint[ib], rtol=1e-12, err_msg=name)


def test_a_soft_limit_overage_is_covered_by_a_neighbours_unused_limit() -> None:
    # Two 1-task jobs on one machine (one pool); job 1 uses 2 GiB under a 1 GiB soft limit.
    over = constant_job([2 * GIB], 1 * GIB, job_id=1)
    roomy = constant_job([1 * GIB], 3 * GIB, job_id=2)  # 2 GiB of its limit unused
    tight = constant_job([1 * GIB], 1 * GIB, job_id=2)  # at its limit
    cfg = config(cell=CellModel(pool_jobs=2, free_fraction=0.0))
    cfg = dataclasses.replace(cfg, manual_response=dataclasses.replace(cfg.manual_response, alert_ooms=10**9))
    spec = parse_recommenders("manual-soft")
    spared = replay_chunk([over, roomy], spec, cfg)["manual-soft"]
    assert int(spared.ooms.sum()) == 0
    killed = replay_chunk([over, tight], spec, cfg)["manual-soft"]
    by_job = {int(j): int(killed.ooms[killed.job_id == j].sum()) for j in (1, 2)}
    assert by_job == {1: T, 2: 0}  # the task over its limit dies; its neighbour at its limit lives


@settings(max_examples=50, deadline=None)
@given(st.floats(0.001, 10.0), st.floats(1.0, 9.0))
def test_cpu_points_keep_the_mean_and_the_peak(mean: float, ratio: float) -> None:
    points, fractions = cpu_points(np.array([mean], np.float32), np.array([mean * ratio], np.float32), None)
    assert fractions.sum() == pytest.approx(1.0)
    assert points.max() == pytest.approx(mean * ratio, rel=1e-6)
    assert (points * fractions).sum() == pytest.approx(mean, rel=1e-5)


def test_cpu_is_throttled_at_the_limit() -> None:
    job = constant_job([GIB], 2 * GIB)
    job = dataclasses.replace(
        job,
        cpu_mean=np.full((T, 1), 2.0, np.float32),
        cpu_peak=np.full((T, 1), 2.0, np.float32),
        cpu_limit=np.full((T, 1), 1.0, np.float32),
    )
    rows = replay_chunk([job], parse_recommenders("manual-hard"), config(cpu=True))["manual-hard"]
    np.testing.assert_allclose(rows.cpu_throttled_fraction, 0.5)
    np.testing.assert_allclose(rows.cpu_relative_slack, 0.0)


def test_plan_chunks_bounds_tasks_and_jobs() -> None:
    assert plan_chunks([5, 5, 5, 20, 1], max_tasks=10, max_jobs=64) == [[0, 1], [2], [3], [4]]
    assert plan_chunks([1] * 5, max_tasks=100, max_jobs=2) == [[0, 1], [2, 3], [4]]


def test_plan_chunks_keeps_pools_whole() -> None:
    # Pools of two jobs: [0, 1], [2, 3], [4]; a pool over the limits is a chunk of its own.
    assert plan_chunks([5, 5, 5, 20, 1], max_tasks=10, max_jobs=64, pool_jobs=2) == [[0, 1], [2, 3], [4]]
    assert plan_chunks([1] * 5, max_tasks=100, max_jobs=3, pool_jobs=2) == [[0, 1], [2, 3, 4]]


def test_run_study_counts_days_and_reports_progress_per_chunk() -> None:
    """Chunks are the shards (on a cluster too: tests/integration/evaluate/test_studies_on_dask.py)."""
    workload = AutopilotWorkloadConfig(jobs=4, days=3, seed=6, max_tasks=4, with_cpu=False)
    specs = [STANDARD_RECOMMENDERS["manual-hard"], STANDARD_RECOMMENDERS["moving-window"]]
    cfg = ReplayConfig(warmup_days=1)
    seen: list[tuple[int, int]] = []
    serial = run_study(workload, specs, cfg, max_chunk_tasks=4, progress=lambda d, t: seen.append((d, t)))
    assert seen[0] == (0, 12)
    assert seen[-1] == (12, 12)
    chunks = plan_chunks(task_counts(workload), 4, pool_jobs=cfg.cell.pool_jobs)
    assert len(seen) == 1 + len(chunks)
    assert serial.measured_days == 2
    assert serial.replayed_job_days == 12
    with pytest.raises(ValueError):
        run_study(workload, specs, ReplayConfig(warmup_days=3))


def test_parse_recommenders() -> None:
    specs = parse_recommenders("ml, vpa:hard")
    assert [s.name for s in specs] == ["ml", "vpa:hard"]
    assert specs[1].enforcement.value == "hard"
    for bad in ("nope", "ml,ml", ""):
        with pytest.raises(ValueError):
            parse_recommenders(bad)


def test_an_ml_spec_carries_its_own_hyperparameters() -> None:
    """A sweep replays several ML configurations side by side: each spec's own config is used."""
    workload = AutopilotWorkloadConfig(jobs=2, days=2, seed=8, max_tasks=4, with_cpu=False)
    jobs = [generate_job(workload, j) for j in range(2)]
    ml = STANDARD_RECOMMENDERS["ml"]
    cautious = dataclasses.replace(config().ml, w_underrun=0.001)
    greedy = dataclasses.replace(config().ml, w_underrun=0.5)
    specs = [
        dataclasses.replace(ml, name="cautious", ml=cautious),
        dataclasses.replace(ml, name="greedy", ml=greedy),
        ml,  # no override: the replay's own configuration
    ]
    rows = replay_chunk(jobs, specs, config(ml=cautious))
    assert rows["greedy"].average_limit.sum() < rows["cautious"].average_limit.sum()
    np.testing.assert_array_equal(rows["ml"].average_limit, rows["cautious"].average_limit)
