"""Scorers on hand-built machines, lexicographic composition, and the plugin registry."""

from __future__ import annotations

import numpy as np
import pytest
from schedule_builders import cell_of, machine, task

from cellpilot.schedule import (
    BestFit,
    Cell,
    FailureDomainSpread,
    HybridStranding,
    Level,
    Lexicographic,
    PackageLocality,
    PlacementConstraint,
    PlacementTask,
    PreemptionCost,
    PriorityMixing,
    Request,
    SoftConstraints,
    Weighted,
    WorstFit,
    build_plugin,
    build_profile,
    registered,
)
from cellpilot.schedule.plugins import Scorer


def scores(scorer: Scorer, cell: Cell, spec: PlacementTask) -> np.ndarray:
    req = Request.compile(spec.shape)
    req.job = cell.job_code(spec.job)
    out = scorer.score(cell, req, np.arange(cell.n_machines))
    assert np.all((out >= 0) & (out <= 100)), out
    return out


def loaded_cell(loads: list[tuple[float, float]]) -> Cell:
    """Identical 10-core / 40 GiB machines with (cores, GiB) of batch limits on each."""
    cell = cell_of(*[machine(f"m{i}", cores=10, ram_gib=40, disk_gib=100) for i in range(len(loads))])
    for i, (cores, ram) in enumerate(loads):
        if cores or ram:
            cell.bind(task("fill", i, priority=2, cores=cores, ram_gib=ram), i, now=0.0)
    return cell


def test_best_fit_scores_utilisation_after_placement() -> None:
    cell = loaded_cell([(0, 0), (5, 20), (8, 4)])
    got = scores(BestFit(cpu=1, ram=1, disk=0), cell, task("new", priority=2, cores=1, ram_gib=4))
    # mean of (cpu, ram) utilisation after adding 1 core and 4 GiB, times 100
    expected = [100 * (0.1 + 0.1) / 2, 100 * (0.6 + 0.6) / 2, 100 * (0.9 + 0.2) / 2]
    np.testing.assert_allclose(got, expected)


def test_worst_fit_prefers_the_emptiest_machine() -> None:
    cell = loaded_cell([(5, 20), (0, 0), (8, 4)])
    got = scores(WorstFit(base=16.0, cpu=1, ram=1, disk=0), cell, task("new", priority=2, cores=1, ram_gib=4))
    assert int(np.argmax(got)) == 1
    # E-PVM cost increase on machine 1: (16^0.1 - 1) per resource, averaged; normalised by 15.
    assert got[1] == pytest.approx(100 * (1 - (16**0.1 - 1) / 15))


def test_hybrid_prefers_balanced_leftovers_over_tighter_stranding() -> None:
    # Both machines end at a mean utilisation of 0.625, but machine 0 is then CPU-full.
    cell = loaded_cell([(9, 6), (5.25, 21)])
    cell.anticipated_shape = np.array([1000.0, 4 * 2**30, 0.0, 0.0])  # 1 core and 4 GiB per task
    spec = task("new", priority=2, cores=1, ram_gib=4)
    hybrid = scores(HybridStranding(cpu=1, ram=1, disk=0), cell, spec)
    best = scores(BestFit(cpu=1, ram=1, disk=0), cell, spec)
    np.testing.assert_allclose(best, [62.5, 62.5])
    # Machine 0 strands its 75 % free RAM (no CPU left for a typical task); machine 1 strands nothing.
    np.testing.assert_allclose(hybrid, [100 * (0.625 + (1 - 0.375)) / 2, 100 * (0.625 + 1) / 2])


def test_spread_prefers_other_machines_racks_and_power_domains() -> None:
    cell = cell_of(
        machine("a", rack="r0", power="p0"),
        machine("b", rack="r0", power="p0"),
        machine("c", rack="r1", power="p0"),
        machine("d", rack="r2", power="p1"),
    )
    cell.bind(task("web", 0), 0, now=0.0)
    got = scores(FailureDomainSpread(machine=0.6, rack=0.25, power=0.15), cell, task("web", 1))
    expected = [
        100 * (0.6 / 2 + 0.25 / 2 + 0.15 / 2),
        100 * (0.6 + 0.25 / 2 + 0.15 / 2),
        100 * (0.6 + 0.25 + 0.15 / 2),
        100.0,
    ]
    np.testing.assert_allclose(got, expected)
    assert scores(FailureDomainSpread(), cell, task("other", 0)).tolist() == [100.0] * 4


def test_package_locality_and_soft_constraints() -> None:
    cell = cell_of(machine("a", arch="x86"), machine("b", arch="arm"))
    cell.bind(task("old", 0, packages=("libfoo",)), 0, now=0.0)
    spec = task("new", packages=("libfoo", "bar"))
    np.testing.assert_allclose(scores(PackageLocality(), cell, spec), [50.0, 0.0])
    soft = (
        PlacementConstraint("arch", "==", "arm", hard=False, weight=3),
        PlacementConstraint("ssd", "!=", "no", hard=False),
    )
    np.testing.assert_allclose(scores(SoftConstraints(), cell, task("new", constraints=soft)), [25.0, 100.0])


def test_priority_mixing_prefers_an_even_mix() -> None:
    cell = loaded_cell([(0, 0), (2, 1), (6, 1)])
    got = scores(PriorityMixing(), cell, task("svc", priority=9, cores=2))
    # prod share of CPU limits after placement: 1, 2/4, 2/8
    np.testing.assert_allclose(got, [0.0, 100.0, 100 * 4 * 0.25 * 0.75])


def test_preemption_cost_prefers_no_victims_then_lower_priority_then_fewer() -> None:
    cell = cell_of(*[machine(f"m{i}", cores=10) for i in range(4)])
    cell.bind(task("a", 0, priority=3, cores=5), 0, now=0.0)  # fits without preempting
    cell.bind(task("b", 0, priority=2, cores=9), 1, now=0.0)  # one victim at priority 2
    cell.bind(task("c", 0, priority=4, cores=9), 2, now=0.0)  # one victim at priority 4
    for i in range(3):
        cell.bind(task("d", i, priority=2, cores=3), 3, now=0.0)  # two or more victims at priority 2
    got = scores(PreemptionCost(), cell, task("new", priority=6, cores=5))
    assert got[0] == 100.0
    assert got[1] > got[3] > got[2]
    assert got[1] == pytest.approx(90 * (1 - 3 / 12) + 10 / 2)


@pytest.mark.parametrize(
    ("matrix", "quanta", "best"),
    [
        ([[100, 10], [100, 90], [50, 99]], (0, 0), 1),  # first level ties, second decides
        ([[100, 10], [99, 90]], (0, 0), 0),  # exact comparison: 100 beats 99
        ([[100, 10], [99, 90]], (10, 0), 0),  # buckets 10 and 9 differ
        ([[95, 10], [91, 90], [89, 99]], (10, 0), 1),  # 95 and 91 share bucket 9, 89 does not
        ([[5, 5], [5, 5]], (0, 0), 0),  # full tie: first row
    ],
    ids=["tie-break", "exact", "quantum-boundary", "quantum-bucket", "full-tie"],
)
def test_lexicographic_select(matrix: list[list[float]], quanta: tuple[float, float], best: int) -> None:
    levels = tuple(Level(PreemptionCost(), q) for q in quanta)
    assert Lexicographic(levels).select(np.array(matrix, dtype=float)) == best


def test_weighted_is_a_weighted_mean() -> None:
    cell = loaded_cell([(0, 0), (5, 20)])
    spec = task("new", priority=2, cores=1, ram_gib=4)
    a, b = BestFit(), WorstFit()
    combined = scores(Weighted(((a, 3.0), (b, 1.0))), cell, spec)
    np.testing.assert_allclose(combined, (3 * scores(a, cell, spec) + scores(b, cell, spec)) / 4)


@pytest.mark.parametrize(
    ("kind", "name", "args", "message"),
    [
        ("scorer", "nope", {}, "unknown scorer"),
        ("scorer", "best-fit", {"cpus": 1.0}, "no argument"),
        ("scorer", "best-fit", {"cpu": "high"}, "must be a number"),
        ("scorer", "best-fit", {"cpu": -1.0}, "weights"),
        ("scorer", "worst-fit", {"base": 1.0}, "base"),
        ("filter", "resources", {"gpa_rho": 1.5}, "gpa_rho"),
        ("preemptor", "lowest-priority-first", {"x": 1}, "no argument"),
    ],
    ids=[
        "unknown-name",
        "unknown-arg",
        "wrong-type",
        "negative-weight",
        "bad-base",
        "bad-rho",
        "preemptor-arg",
    ],
)
def test_plugins_validate_arguments_when_built(
    kind: str, name: str, args: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        build_plugin(kind, name, args)


def test_registry_and_profile_from_plain_data() -> None:
    assert {"best-fit", "worst-fit", "hybrid", "spread", "packages", "preemption-cost"} <= set(
        registered("scorer")
    )
    profile = build_profile(
        {
            "filters": ["hard-constraints", {"name": "resources", "args": {"gpa_rho": 0.01}}],
            "levels": [
                {"scorer": "preemption-cost"},
                {"weighted": [{"name": "spread", "weight": 2}, "soft-constraints"], "quantum": 10},
                {"scorer": "hybrid", "args": {"stranding_weight": 2}},
            ],
        }
    )
    assert profile.resource_fit.gpa_rho == 0.01
    assert profile.scoring.levels[1].quantum == 10
    assert profile.scoring.job_columns == (1,)
    with pytest.raises(ValueError, match="resources"):
        build_profile({"filters": ["hard-constraints"]})
