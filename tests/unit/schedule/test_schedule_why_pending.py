"""Why pending? (Borg §2.6): exclusion counts per constraint and resource, and the smallest fix."""

from __future__ import annotations

import pytest
from schedule_builders import cell_of, gib, machine, task

from cellpilot.schedule import Cell, PlacementConstraint, Scheduler, default_profile, explain_pending

X86 = (PlacementConstraint("arch", "==", "x86"),)


def three_machines() -> Cell:
    return cell_of(
        machine("a", cores=8, ram_gib=32, arch="x86"),
        machine("b", cores=16, ram_gib=16, arch="x86"),
        machine("c", cores=32, ram_gib=64, arch="arm"),
    )


def test_counts_and_ranked_options() -> None:
    explanation = explain_pending(
        three_machines(), task("big", cores=12, ram_gib=22, constraints=X86), default_profile()
    )
    excluded = dict(explanation.excluded)
    assert explanation.machines == 3
    assert explanation.feasible == 0
    assert excluded["constraint arch == 'x86'"] == 1  # c
    assert excluded["cpu"] == 1  # a: 8 < 12 cores
    assert excluded["ram"] == 1  # b: 16 < 22 GiB
    kinds = [(o.kind, o.resource) for o in explanation.options]
    assert kinds == [("reduce", "ram"), ("scale", None), ("reduce", "cpu"), ("drop-constraint", None)]
    ram, scale, cpu, drop = explanation.options
    assert ram.amount == pytest.approx(gib(6))
    assert ram.relative == pytest.approx(6 / 22)
    assert scale.factor == pytest.approx(16 / 22)
    assert cpu.amount == pytest.approx(4000.0)
    assert cpu.relative == pytest.approx(4 / 12)
    assert drop.constraint == X86[0]
    assert drop.machines == 1
    assert explanation.smallest == ram
    assert "lower ram by 6 GiB" in explanation.summary()


@pytest.mark.parametrize(
    ("running", "spec", "feasible"),
    [
        ([], task("small", cores=2, ram_gib=2, constraints=X86), 2),
        ([task("batch", 0, priority=2, cores=8)], task("svc", priority=9, cores=6, ram_gib=2), 3),
        ([task("batch", 0, priority=2, cores=8)], task("same", priority=2, cores=6, ram_gib=2), 2),
    ],
    ids=["fits-now", "fits-by-preemption", "equal-priority-cannot-preempt"],
)
def test_feasible_tasks_need_no_change(running: list, spec: object, feasible: int) -> None:  # type: ignore[type-arg]
    cell = three_machines()
    for s in running:
        cell.bind(s, 0, now=0.0)
    explanation = explain_pending(cell, spec, default_profile())  # type: ignore[arg-type]
    assert explanation.feasible == feasible
    assert explanation.options == ()
    assert "fits on" in explanation.summary()


def test_unschedulable_anywhere_reports_the_resource() -> None:
    explanation = explain_pending(three_machines(), task("huge", cores=64, ram_gib=8), default_profile())
    assert dict(explanation.excluded)["cpu"] == 3
    assert explanation.smallest is not None
    assert explanation.smallest.resource == "cpu"
    assert explanation.smallest.amount == pytest.approx(32_000.0)  # down to the largest machine's 32 cores


def test_gpa_is_named_when_it_decides_cpu() -> None:
    cell = cell_of(machine("a", cores=10))
    cell.bind(task("old", 0, priority=5, cores=9, cpu_mean=9000.0, cpu_std=100.0), 0, now=0.0)
    explanation = explain_pending(
        cell, task("new", priority=5, cores=2, cpu_mean=2000.0, cpu_std=100.0), default_profile(gpa_rho=0.01)
    )
    assert dict(explanation.excluded)["cpu (GPA)"] == 1


def test_alloc_set_tasks_are_explained_against_their_allocs() -> None:
    cell = cell_of(machine("a", cores=10))
    scheduler = Scheduler(default_profile())
    scheduler.schedule(cell, [task("allocs", 0, priority=9, cores=6, ram_gib=8, is_alloc=True)], now=0.0)
    scheduler.schedule(cell, [task("in", 0, priority=9, cores=4, alloc_set="allocs")], now=0.0)
    explanation = explain_pending(
        cell, task("in", 1, priority=9, cores=3, alloc_set="allocs"), default_profile()
    )
    assert explanation.machines == 1
    assert explanation.feasible == 0
    assert dict(explanation.excluded)["alloc cpu"] == 1
    assert explanation.smallest is not None
    assert explanation.smallest.amount == pytest.approx(1000.0)
