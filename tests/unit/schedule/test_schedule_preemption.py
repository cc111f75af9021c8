"""Preemption (Borg §3.2, §2.5): lowest priority first, prod never preempts prod, victims pend."""

from __future__ import annotations

import pytest
from schedule_builders import cell_of, machine, task

from cellpilot.schedule import (
    Cell,
    LowestPriorityFirst,
    Placement,
    PlacementTask,
    Request,
    Resources,
    Scheduler,
    SchedulerConfig,
    Unschedulable,
    default_profile,
)


def one_machine(running: list[PlacementTask]) -> tuple[Cell, dict[str, int]]:
    cell = cell_of(machine("a", cores=10, ram_gib=40))
    handles = {spec.task_id: cell.bind(spec, 0, now=0.0) for spec in running}
    return cell, handles


@pytest.mark.parametrize(
    ("running", "newcomer", "victims"),
    [
        # Room already: nobody is evicted.
        ([task("b", 0, priority=3, cores=5)], task("new", priority=6, cores=5), []),
        # Lowest priority goes first, even if a higher one alone would do.
        ([task("low", 0, priority=2, cores=3), task("mid", 0, priority=4, cores=6)],
         task("new", priority=6, cores=5), ["low/0", "mid/0"]),
        ([task("low", 0, priority=2, cores=5), task("mid", 0, priority=4, cores=5)],
         task("new", priority=6, cores=5), ["low/0"]),
        # Within a priority, the larger task first (fewer preemptions).
        ([task("x", 0, priority=2, cores=2), task("y", 0, priority=2, cores=7)],
         task("new", priority=6, cores=8), ["y/0"]),
        # Production evicts batch but not production.
        ([task("svc", 0, priority=9, cores=6), task("b", 0, priority=8, cores=4)],
         task("new", priority=10, cores=4), ["b/0"]),
    ],
    ids=["fits", "lowest-first", "stops-when-fits", "larger-first", "prod-spares-prod"],
)  # fmt: skip
def test_victims_lowest_priority_first(
    running: list[PlacementTask], newcomer: PlacementTask, victims: list[str]
) -> None:
    cell, _ = one_machine(running)
    req = Request.compile(newcomer.shape)
    chosen = LowestPriorityFirst().victims(cell, req, 0, default_profile().fits)
    assert chosen is not None
    assert [cell.spec(h).task_id for h in chosen.tolist()] == victims


@pytest.mark.parametrize(
    ("running", "newcomer"),
    [
        ([task("svc", 0, priority=9, cores=8)], task("new", priority=10, cores=4)),
        ([task("b", 0, priority=5, cores=8)], task("new", priority=5, cores=4)),
        ([task("mon", 0, priority=11, cores=8)], task("new", priority=11, cores=4)),
    ],
    ids=["prod-vs-prod", "equal-batch", "monitoring-vs-monitoring"],
)
def test_no_victims_when_not_allowed(running: list[PlacementTask], newcomer: PlacementTask) -> None:
    cell, _ = one_machine(running)
    req = Request.compile(newcomer.shape)
    assert LowestPriorityFirst().victims(cell, req, 0, default_profile().fits) is None
    result = Scheduler(default_profile()).schedule(cell, [newcomer], now=1.0)
    assert not result.placements
    assert not result.preempted
    assert [u.task.task_id for u in result.unschedulable] == ["new/0"]


def test_victims_return_to_pending_and_leave_the_cell() -> None:
    cell, _ = one_machine([task("b", i, priority=2, cores=3) for i in range(3)])
    newcomer = task("svc", 0, priority=9, cores=8)
    result = Scheduler(default_profile()).schedule(cell, [newcomer], now=1.0)
    assert [p.task.task_id for p in result.placements] == ["svc/0"]
    victims = sorted(v.task_id for v in result.preempted)
    assert victims == sorted(v.task_id for v in result.placements[0].preempted)
    assert len(victims) == 3  # 8 cores need all three 3-core tasks gone from the 10-core machine
    assert set(victims) <= {t.task_id for t in result.pending}
    assert all(v not in cell.task_handle for v in victims)


def test_scheduler_prefers_a_machine_without_preemption() -> None:
    cell = cell_of(machine("busy", cores=10), machine("free", cores=10))
    cell.bind(task("b", 0, priority=2, cores=9), 0, now=0.0)
    outcome = Scheduler(default_profile()).place(cell, task("new", priority=9, cores=5), now=1.0)
    assert isinstance(outcome, Placement)
    assert outcome.machine_name == "free"
    assert not outcome.preempted


def test_preempting_an_alloc_evicts_the_tasks_inside_it() -> None:
    cell, handles = one_machine([task("allocs", 0, priority=4, cores=6, is_alloc=True)])
    inner = task("inner", 0, priority=4, cores=2, alloc_set="allocs")
    cell.bind(inner, 0, now=0.0, alloc=handles["allocs/0"])
    result = Scheduler(default_profile()).schedule(cell, [task("new", priority=9, cores=8)], now=1.0)
    assert sorted(v.task_id for v in result.preempted) == ["allocs/0", "inner/0"]
    assert cell.alloc_sets["allocs"] == set()


def test_naive_and_fast_schedulers_agree_on_preemption() -> None:
    outcomes = []
    for config in (SchedulerConfig(relaxed_randomization=False), SchedulerConfig.naive()):
        cell, _ = one_machine([task("b", i, priority=2 + i, cores=3) for i in range(3)])
        outcome = Scheduler(default_profile(), config).place(cell, task("new", priority=9, cores=3), now=1.0)
        assert not isinstance(outcome, Unschedulable)
        outcomes.append([v.task_id for v in outcome.preempted])
    assert outcomes[0] == outcomes[1] == ["b/0"]  # 1 core free + 3 from the priority-2 task covers 3


def test_resize_that_no_longer_fits_is_refused() -> None:
    cell, handles = one_machine([task("svc", 0, priority=9, cores=6), task("b", 0, priority=3, cores=4)])
    h = handles["svc/0"]
    assert cell.resize(h, Resources.of(6, 1)).ok
    refused = cell.resize(h, Resources.of(7, 1))  # limits basis: 6 + 4 already use all 10 cores
    assert not refused.ok
    assert "cpu" in refused.reason
    assert cell.spec(h).shape.limits.cpu == 6000.0
