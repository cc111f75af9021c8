"""The scheduling pass: order, §3.4 techniques against the naive scheduler, invariants, allocs."""

from __future__ import annotations

from collections import Counter
from statistics import NormalDist

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from schedule_builders import cell_of, machine, prod_limit_sum, recomputed_totals, task

from cellpilot.job_vocabulary import PriorityBand
from cellpilot.schedule import (
    Cell,
    CellMachine,
    Placement,
    PlacementConstraint,
    PlacementTask,
    Resources,
    Scheduler,
    SchedulerConfig,
    Unschedulable,
    band_of,
    default_profile,
    pending_order,
)
from cellpilot.schedule.cell import RESERVATION


def test_pending_order_is_priority_then_round_robin_over_users() -> None:
    tasks = [
        task("a", 0, user="ann", priority=5),
        task("a", 1, user="ann", priority=5),
        task("a", 2, user="ann", priority=5),
        task("b", 0, user="bob", priority=5),
        task("c", 0, user="cy", priority=9),
        task("c", 1, user="cy", priority=9),
    ]
    assert [t.task_id for t in pending_order(tasks)] == ["c/0", "c/1", "a/0", "b/0", "a/1", "a/2"]


def random_cell(rng: np.random.Generator, n: int) -> list[CellMachine]:
    return [
        machine(
            f"m{i}",
            cores=float(rng.choice([8, 16, 32])),
            ram_gib=float(rng.choice([16, 64, 128])),
            rack=f"r{i // 4}",
            power=f"p{i // 8}",
            arch=str(rng.choice(["x86", "arm"])),
        )
        for i in range(n)
    ]


def random_tasks(rng: np.random.Generator, jobs: int, prefix: str = "j") -> list[PlacementTask]:
    out: list[PlacementTask] = []
    for j in range(jobs):
        priority = int(rng.integers(0, 12))
        constraints = (PlacementConstraint("arch", "==", "x86"),) if rng.random() < 0.2 else ()
        if rng.random() < 0.2:
            constraints += (PlacementConstraint("arch", "==", "arm", hard=False),)
        cores = float(rng.choice([0.5, 1, 2, 4, 8]))
        ram = float(rng.choice([1, 2, 8, 24]))
        user = f"u{int(rng.integers(0, 3))}"
        for i in range(int(rng.integers(1, 8))):
            out.append(
                task(f"{prefix}{j}", i, user=user, priority=priority, cores=cores, ram_gib=ram,
                     constraints=constraints, packages=(f"pkg{j % 3}",))
            )  # fmt: skip
    return out


def placements_by_task(results: list[list[Placement]]) -> list[dict[str, str]]:
    return [{p.task.task_id: p.machine_name for p in placed} for placed in results]


def run_passes(config: SchedulerConfig, seed: int) -> tuple[list[list[Placement]], list[list[str]]]:
    """Three passes with task exits, a machine removal and an addition in between."""
    rng = np.random.default_rng(seed)
    cell = Cell(invalidation_tolerance=0.0)
    cell.add_machines(random_cell(rng, 12))
    scheduler = Scheduler(default_profile(), config, np.random.default_rng(seed))
    pending = random_tasks(rng, 12, "a")
    placed: list[list[Placement]] = []
    victims: list[list[str]] = []
    for step in range(3):
        result = scheduler.schedule(cell, pending, now=float(step))
        placed.append(list(result.placements))
        victims.append(sorted(v.task_id for v in result.preempted))
        running = sorted(cell.task_handle.items())
        for _, handle in running[::3]:
            if cell.t_alive[handle]:
                cell.unbind(handle)
        if step == 0:
            cell.remove_machine(3)
        if step == 1:
            cell.add_machine(machine("late", cores=32, ram_gib=128, rack="r9", arch="x86"))
        pending = list(result.pending) + random_tasks(rng, 6, f"s{step}-")
    return placed, victims


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_equivalence_classes_and_score_cache_do_not_change_decisions(seed: int) -> None:
    fast = run_passes(SchedulerConfig(relaxed_randomization=False), seed)
    naive = run_passes(SchedulerConfig.naive(), seed)
    assert placements_by_task(fast[0]) == placements_by_task(naive[0])
    assert fast[1] == naive[1]


def test_relaxed_randomisation_examines_fewer_machines() -> None:
    rng = np.random.default_rng(7)
    machines = [machine(f"m{i}", cores=16, ram_gib=64, rack=f"r{i // 10}", arch="x86") for i in range(400)]
    tasks = random_tasks(rng, 30)
    evaluated = {}
    for name, config in {
        "all-on": SchedulerConfig(enough_feasible=20),
        "naive": SchedulerConfig.naive(),
    }.items():
        cell = cell_of(*machines)
        scheduler = Scheduler(default_profile(), config)
        result = scheduler.schedule(cell, tasks, now=0.0)
        assert len(result.placements) == len(tasks)
        evaluated[name] = scheduler.stats.machines_evaluated
    assert evaluated["naive"] == 400 * len(tasks)
    assert evaluated["all-on"] < evaluated["naive"] / 5


def test_equivalence_classes_share_work_across_a_job() -> None:
    machines = [machine(f"m{i}", cores=16) for i in range(50)]
    tasks = [task("big", i, priority=5, cores=1) for i in range(40)]
    counts = {}
    for eq in (True, False):
        scheduler = Scheduler(
            default_profile(), SchedulerConfig(equivalence_classes=eq, relaxed_randomization=False)
        )
        scheduler.schedule(cell_of(*machines), tasks, now=0.0)
        counts[eq] = (scheduler.stats.pools_built, scheduler.stats.machines_evaluated)
    assert counts[True][0] == 1
    assert counts[False][0] == 40
    assert counts[True][1] < counts[False][1]


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.booleans())
def test_scheduling_invariants(seed: int, relaxed: bool) -> None:
    rng = np.random.default_rng(seed)
    cell = Cell()
    cell.add_machines(random_cell(rng, 8))
    scheduler = Scheduler(
        default_profile(), SchedulerConfig(relaxed_randomization=relaxed, enough_feasible=3)
    )
    pending = random_tasks(rng, 10)
    for step in range(3):
        result = scheduler.schedule(cell, pending, now=float(step))
        np.testing.assert_allclose(cell.below[: cell.n_machines], recomputed_totals(cell), atol=1e-6)
        for m in cell.alive_machines().tolist():
            capacity = cell.capacity[m]
            # Production limits never exceed the machine; reservations (what everyone is placed on) neither.
            assert np.all(prod_limit_sum(cell, m) <= capacity + 1e-6)
            reserved = sum((cell.t_amount[h, RESERVATION] for h in cell.tasks_on(m)), np.zeros(4))
            assert np.all(reserved <= capacity + 1e-6)
        for placement in result.placements:
            for victim in placement.preempted:
                assert victim.priority < placement.task.priority
                if band_of(placement.task.priority) == PriorityBand.PRODUCTION:
                    assert band_of(victim.priority) != PriorityBand.PRODUCTION
                assert victim.task_id not in cell.task_handle
                assert victim in result.pending
        pending_ids = Counter(t.task_id for t in result.pending)
        assert all(count == 1 for count in pending_ids.values())
        assert not set(pending_ids) & set(cell.task_handle)
        pending = list(result.pending) + random_tasks(rng, 4, f"n{step}-")


def test_removed_machine_is_never_used_again() -> None:
    cell = cell_of(machine("a"), machine("b"))
    scheduler = Scheduler(default_profile())
    first = scheduler.schedule(cell, [task("j", i, cores=1) for i in range(4)], now=0.0)
    assert len(first.placements) == 4
    evicted = cell.remove_machine(0)
    again = scheduler.schedule(cell, evicted, now=1.0)
    assert {p.machine_name for p in again.placements} <= {"b"}
    assert len(again.placements) == len(evicted)


def test_machine_added_later_is_considered() -> None:
    cell = cell_of(machine("small", cores=2))
    scheduler = Scheduler(default_profile())
    big = task("big", 0, cores=8)
    assert isinstance(scheduler.place(cell, big, now=0.0), Unschedulable)
    cell.add_machine(machine("large", cores=16))
    outcome = scheduler.place(cell, big, now=1.0)
    assert isinstance(outcome, Placement)
    assert outcome.machine_name == "large"


def test_tasks_run_inside_allocs_and_use_only_their_resources() -> None:
    cell = cell_of(machine("a", cores=10), machine("b", cores=10))
    scheduler = Scheduler(default_profile())
    allocs = [task("web-allocs", i, priority=9, cores=6, ram_gib=8, is_alloc=True) for i in range(2)]
    placed = scheduler.schedule(cell, allocs, now=0.0)
    assert sorted(p.machine_name for p in placed.placements) == ["a", "b"]  # spread across machines
    inner = [task("web", i, priority=9, cores=2, ram_gib=2, alloc_set="web-allocs") for i in range(7)]
    result = scheduler.schedule(cell, inner, now=1.0)
    assert len(result.placements) == 6  # 3 per 6-core alloc
    assert [u.task.task_id for u in result.unschedulable] == ["web/6"]
    assert "room" in result.unschedulable[0].reason
    for m in range(2):  # the machines only see the allocs
        assert cell.below[m, -1, 0] == pytest.approx(6000.0)
    # Outside the allocs, 4 cores are left on each machine.
    outside = scheduler.place(cell, task("other", 0, priority=9, cores=4), now=2.0)
    assert isinstance(outside, Placement)


def test_resize_and_usage_updates_keep_the_cell_consistent() -> None:
    cell = cell_of(machine("a", cores=16), machine("b", cores=16))
    handles = [cell.bind(task("j", i, priority=3 + i % 7, cores=2), i % 2, now=0.0) for i in range(8)]
    assert cell.resize(handles[0], Resources.of(3, 2)).ok
    cell.update_usage(handles[1:5], np.full((4, 4), 100.0), now=5_000.0)
    cell.set_cpu_stats(handles[:3], [100.0, 200.0, 300.0], [10.0, 20.0, 30.0])
    cell.unbind(handles[5])
    np.testing.assert_allclose(cell.below[: cell.n_machines], recomputed_totals(cell))
    counts = Counter(int(cell.t_machine[h]) for h in cell.running_tasks().tolist())
    job = cell.job_codes["j"]
    assert cell.job_machine_counts[job] == dict(counts)


@pytest.mark.parametrize("rho", [0.0, 0.1, 0.01], ids=["limits", "gpa-0.1", "gpa-0.01"])
def test_gpa_lets_non_prod_work_share_cpu_by_usage(rho: float) -> None:
    cell = cell_of(machine("a", cores=10, ram_gib=40))
    tasks = [task("b", i, priority=5, cores=1, ram_gib=0.1, cpu_mean=300.0, cpu_std=100.0) for i in range(40)]
    result = Scheduler(default_profile(gpa_rho=rho)).schedule(cell, tasks, now=0.0)
    if rho == 0.0:
        expected = 10  # CPU limits (= initial reservations) fill the 10 cores
    else:
        z = NormalDist().inv_cdf(1 - rho)
        expected = max(n for n in range(1, 41) if 300.0 * n + z * 100.0 * n**0.5 <= 10_000.0)
    assert len(result.placements) == expected
