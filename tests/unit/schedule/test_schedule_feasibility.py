"""Feasibility: limits vs reservations, preemptible resources, constraints, GPA for CPU."""

from __future__ import annotations

from statistics import NormalDist

import numpy as np
import pytest
from schedule_builders import cell_of, machine, task

from cellpilot.schedule import (
    Cell,
    HardConstraints,
    PlacementConstraint,
    PlacementTask,
    Request,
    ResourceFit,
    Resources,
)


def feasible(cell: Cell, spec: PlacementTask, fit: ResourceFit | None = None) -> bool:
    req = Request.compile(spec.shape)
    machines = np.arange(cell.n_machines)
    ok = (fit or ResourceFit()).feasible(cell, req, machines) & HardConstraints().feasible(
        cell, req, machines
    )
    return bool(ok[0])


# Each case: tasks already on a 10-core, 40 GiB machine, then the newcomer and the verdict.
CASES = [
    # A prod task reserving 3 of its 8 cores: prod newcomers see the limit, non-prod the reservation.
    (
        [task("svc", 0, priority=9, cores=8, reservation=Resources.of(3, 1))],
        task("new", priority=9, cores=3),
        False,
    ),
    (
        [task("svc", 0, priority=9, cores=8, reservation=Resources.of(3, 1))],
        task("new", priority=5, cores=3),
        True,
    ),
    (
        [task("svc", 0, priority=9, cores=8, reservation=Resources.of(3, 1))],
        task("new", priority=5, cores=7),
        True,
    ),
    (
        [task("svc", 0, priority=9, cores=8, reservation=Resources.of(3, 1))],
        task("new", priority=5, cores=7.5),
        False,
    ),
    # Lower-priority tasks count as available; equal priority does not.
    ([task("b", 0, priority=3, cores=6)], task("new", priority=5, cores=8), True),
    ([task("b", 0, priority=3, cores=6)], task("new", priority=3, cores=8), False),
    ([task("b", 0, priority=3, cores=6)], task("new", priority=9, cores=10), True),
    # Production never counts production as preemptible; monitoring does.
    ([task("p", 0, priority=9, cores=6)], task("new", priority=10, cores=8), False),
    ([task("p", 0, priority=9, cores=6)], task("new", priority=11, cores=8), True),
    # Every dimension must fit.
    ([task("b", 0, priority=5, cores=1, ram_gib=30)], task("new", priority=5, cores=1, ram_gib=11), False),
    ([task("b", 0, priority=5, cores=1, ram_gib=30)], task("new", priority=5, cores=1, ram_gib=10), True),
    ([], task("new", priority=5, cores=1, ports=101), False),
]
IDS = [
    "prod-sees-limit", "nonprod-sees-reservation", "nonprod-exact", "nonprod-over",
    "preempt-lower", "equal-not-preemptible", "prod-preempts-batch",
    "prod-not-prod", "monitoring-over-prod", "ram-short", "ram-exact", "ports-short",
]  # fmt: skip


@pytest.mark.parametrize(("running", "newcomer", "expected"), CASES, ids=IDS)
def test_resource_feasibility(running: list[PlacementTask], newcomer: PlacementTask, expected: bool) -> None:
    cell = cell_of(machine("a", cores=10, ram_gib=40))
    for spec in running:
        cell.bind(spec, 0, now=0.0)
    assert feasible(cell, newcomer) == expected


@pytest.mark.parametrize(
    ("constraint", "expected"),
    [
        (PlacementConstraint("arch", "==", "x86"), True),
        (PlacementConstraint("arch", "!=", "x86"), False),
        (PlacementConstraint("arch", "in", ("arm", "x86")), True),
        (PlacementConstraint("arch", "not-in", ("arm",)), True),
        (PlacementConstraint("kernel", ">", 4.0), True),
        (PlacementConstraint("kernel", "<", 4.0), False),
        (PlacementConstraint("kernel", "==", 5.1), True),
        (PlacementConstraint("gpu", "==", "yes"), False),  # missing attribute
        (PlacementConstraint("gpu", "!=", "yes"), True),
        (PlacementConstraint("gpu", "not-in", ("a",)), True),
        (PlacementConstraint("arch", "<", 3.0), False),  # numeric comparison on a string attribute
    ],
    ids=[
        "eq",
        "ne",
        "in",
        "not-in",
        "gt",
        "lt",
        "num-eq",
        "missing-eq",
        "missing-ne",
        "missing-not-in",
        "str-lt",
    ],
)
def test_hard_constraints(constraint: PlacementConstraint, expected: bool) -> None:
    cell = cell_of(machine("a", arch="x86", kernel=5.1))
    assert feasible(cell, task("new", constraints=(constraint,))) == expected


def test_soft_constraints_never_filter() -> None:
    cell = cell_of(machine("a", arch="x86"))
    assert feasible(cell, task("new", constraints=(PlacementConstraint("arch", "==", "arm", hard=False),)))


def test_removed_machines_are_infeasible() -> None:
    cell = cell_of(machine("a"), machine("b"))
    cell.remove_machine(0)
    req = Request.compile(task("new").shape)
    assert ResourceFit().feasible(cell, req, np.array([0, 1])).tolist() == [False, True]


def gaussian_overflow(means: list[float], stds: list[float], capacity: float) -> float:
    """P(sum > capacity) for independent Gaussians: computed with the CDF, not a quantile."""
    return 1.0 - NormalDist(sum(means), sum(s * s for s in stds) ** 0.5).cdf(capacity)


@pytest.mark.parametrize("rho", [0.2, 0.1, 0.05, 0.01], ids=["0.2", "0.1", "0.05", "0.01"])
@pytest.mark.parametrize(("new_mean", "new_std"), [(2000.0, 1000.0), (500.0, 200.0), (3000.0, 100.0)])
def test_gpa_cpu_fit_for_non_prod(rho: float, new_mean: float, new_std: float) -> None:
    cell = cell_of(machine("a", cores=10, ram_gib=40))
    # CPU limits already fill the machine: a limit/reservation check would refuse any CPU.
    for i in range(4):
        cell.bind(task("old", i, priority=5, cores=2.5, cpu_mean=1500.0, cpu_std=500.0), 0, now=0.0)
    newcomer = task("new", priority=5, cores=4, cpu_mean=new_mean, cpu_std=new_std)
    p = gaussian_overflow([1500.0] * 4 + [new_mean], [500.0] * 4 + [new_std], 10_000.0)
    assert feasible(cell, newcomer, ResourceFit(gpa_rho=rho)) == (p <= rho)
    assert not feasible(cell, newcomer)  # without GPA the CPU limits block it


def test_gpa_applies_to_cpu_only_and_not_to_prod() -> None:
    cell = cell_of(machine("a", cores=10, ram_gib=40))
    cell.bind(task("old", 0, priority=5, cores=10, ram_gib=39, cpu_mean=100.0, cpu_std=10.0), 0, now=0.0)
    fit = ResourceFit(gpa_rho=0.01)
    assert not feasible(cell, task("ram", priority=5, cores=1, ram_gib=2, cpu_mean=100.0, cpu_std=10.0), fit)
    prod = task("prod", priority=10, cores=1, cpu_mean=100.0, cpu_std=10.0)
    assert feasible(cell, prod, fit)  # by preempting the batch task, on limits
    cell.bind(task("svc", 0, priority=9, cores=10, ram_gib=1, cpu_mean=100.0, cpu_std=10.0), 0, now=0.0)
    assert not feasible(cell, prod, fit)  # production limits are full; GPA does not apply to prod


def test_filter_exclusions_name_each_reason() -> None:
    cell = cell_of(
        machine("a", cores=4, ram_gib=8, arch="arm"), machine("b", cores=16, ram_gib=8, arch="x86")
    )
    spec = task("new", cores=8, ram_gib=16, constraints=(PlacementConstraint("arch", "==", "x86"),))
    req = Request.compile(spec.shape)
    machines = np.arange(2)
    excluded = {
        **ResourceFit().exclusions(cell, req, machines),
        **HardConstraints().exclusions(cell, req, machines),
    }
    assert excluded["cpu"].tolist() == [True, False]
    assert excluded["ram"].tolist() == [True, True]
    assert excluded["constraint arch == 'x86'"].tolist() == [True, False]
