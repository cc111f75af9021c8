"""Cell compaction (Borg §5.1) and the synthetic cell workload (the CLI is in test_eval_cli.py)."""

from __future__ import annotations

import numpy as np
import pytest

from cellpilot.evaluate.compaction import (
    CompactionConfig,
    Workload,
    compact,
    compaction_goals,
    demand_estimate,
    pack_workload,
    run_compaction,
    synthetic_workload,
)
from cellpilot.schedule import CellMachine, PlacementJob, Resources, TaskShape
from cellpilot.workloads.cell_workload import HETEROGENEOUS, generate_jobs, generate_machines

SMALL = CompactionConfig(machines=30, tasks=150, seeds=2, fill=0.6)


def uniform_workload(machines: int, tasks: int, cores: float) -> Workload:
    specs = [CellMachine.build(f"m{i}", Resources.of(10, 40, 100, 10)) for i in range(machines)]
    job = PlacementJob("j", "u", tasks, TaskShape(priority=5, limits=Resources.of(cores, 1)))
    return Workload(specs, job.tasks())


@pytest.mark.parametrize(
    ("tasks", "cores", "expected"),
    [(10, 5.0, 5), (9, 5.0, 5), (30, 3.0, 10), (7, 10.0, 7), (1, 1.0, 1)],
    ids=["two-per-machine", "odd", "three-per-machine", "one-per-machine", "single"],
)
def test_compaction_finds_the_minimum_on_identical_machines(tasks: int, cores: float, expected: int) -> None:
    workload = uniform_workload(20, tasks, cores)
    config = CompactionConfig(
        machines=20, tasks=tasks, seeds=1, pending_allowance=0.0, policies=("best-fit",)
    )
    assert compact(workload, "best-fit", config, seed=0)["machines"] == expected


def test_compacted_size_is_minimal_for_its_machine_order() -> None:
    workload = synthetic_workload(SMALL)
    outcome = compact(workload, "hybrid", SMALL, seed=1)
    k = outcome["machines"]
    order = np.random.default_rng(1).permutation(len(workload.machines))
    allowed = int(SMALL.pending_allowance * len(workload.tasks))
    pending = [
        pack_workload([workload.machines[i] for i in order[:n]], workload.tasks, "hybrid", SMALL, 1)
        for n in (k - 1, k)
    ]
    fits = [p <= allowed for p in pending]
    assert fits == [False, True]


def test_workload_that_does_not_fit_is_reported() -> None:
    workload = uniform_workload(2, 5, 6.0)
    outcome = compact(workload, "best-fit", CompactionConfig(machines=2, tasks=5, pending_allowance=0.0), 0)
    assert outcome == {"machines": None, "packs": 1, "fits_original": False}


def test_demand_estimate_by_hand() -> None:
    workload = uniform_workload(20, 30, 3.0)  # 90 cores on 10-core machines
    assert demand_estimate(workload.machines, workload.tasks) == 9


def test_summary_reports_the_90th_percentile_and_goals() -> None:
    summary = run_compaction(SMALL)
    assert [row["policy"] for row in summary["rows"]] == ["best-fit", "worst-fit", "hybrid"]
    for row in summary["rows"]:
        sizes = sorted(row["per_seed"])
        assert len(sizes) == 2
        assert row["machines"] == sizes[-1]  # the 90th percentile of two trials is the larger one
        assert row["machines_min"] == sizes[0]
        assert 0 < row["machines"] <= SMALL.machines
    assert set(summary["goals"]) == {
        "hybrid_fewer_machines_than_best-fit",
        "hybrid_fewer_machines_than_worst-fit",
    }


def test_goals_compare_hybrid_with_the_others() -> None:
    rows = [
        {"policy": "best-fit", "machines": 10},
        {"policy": "worst-fit", "machines": 9},
        {"policy": "hybrid", "machines": 9},
    ]
    goals = compaction_goals(rows)
    assert goals["hybrid_fewer_machines_than_best-fit"]["met"]
    assert not goals["hybrid_fewer_machines_than_worst-fit"]["met"]


def test_synthetic_cell_workload_is_heterogeneous_and_sized_to_fill() -> None:
    rng = np.random.default_rng(0)
    machines = generate_machines(200, rng)
    platforms = {dict(m.attributes)["platform"] for m in machines}
    assert platforms == {p.name for p in HETEROGENEOUS}
    jobs = generate_jobs(machines, 1000, rng, fill=0.5)
    assert sum(j.job.task_count for j in jobs) == 1000
    cpu = sum(j.job.task_count * j.job.shape.limits.cpu for j in jobs)
    capacity = sum(m.capacity.cpu for m in machines)
    assert cpu / capacity == pytest.approx(0.5, rel=0.02)  # tiny tasks are floored at 0.01 cores
    sizes = [j.job.task_count for j in jobs]
    assert sizes.count(1) > len(sizes) / 3  # heavy-tailed: many single-task jobs ...
    assert max(sizes) > 20  # ... and some large ones
    reclaimed = jobs[0].tasks(reclaimed=True)[0]
    assert reclaimed.reservation is not None
    assert np.all(reclaimed.reservation.array() <= reclaimed.shape.limits.array() + 1e-9)
