"""The replay's machines: placement per pool, and kills by the Borglet's enforcement."""

from __future__ import annotations

import numpy as np
import pytest

from cellpilot.evaluate.replay_machines import CellModel, ReplayMachines, place_tasks, pools_of

GIB = float(1 << 30)


def test_pools_are_runs_of_consecutive_jobs() -> None:
    assert list(pools_of(5, 2)) == [0, 0, 1, 1, 2]


def test_a_pool_gets_enough_machines_for_its_requests_and_spreads_its_tasks() -> None:
    requests = np.array([30, 30, 30, 30, 10, 10], dtype=np.float64) * GIB
    pools = np.array([0, 0, 0, 0, 1, 1], dtype=np.intp)
    machine, count = place_tasks(requests, pools, machine_bytes=64 * GIB)
    # Pool 0 asks 120 GiB -> 2 machines, two tasks each; pool 1 asks 20 GiB -> 1 machine of its own.
    assert count == 3
    assert sorted(np.bincount(machine[:4]).tolist()) == [2, 2]
    assert set(machine[4:].tolist()) == {2}


def machines_of(*assignment: int, priority: list[int] | None = None) -> ReplayMachines:
    n = len(assignment)
    return ReplayMachines(
        machine=np.array(assignment, dtype=np.intp),
        count=max(assignment) + 1,
        priority=np.array(priority or [0] * n, dtype=np.int64),
        free_bytes=0.0,
    )


def test_a_hard_limit_kills_whatever_the_machine() -> None:
    machines = machines_of(0, 0)
    running = np.array([True, True])
    usage = np.array([2.0, 1.0]) * GIB
    limit = np.array([1.0, 8.0]) * GIB  # the neighbour leaves 7 GiB unused: no help for a hard limit
    assert machines.memory_kills(running, usage, limit, hard=True).tolist() == [True, False]
    assert machines.memory_kills(running, usage, limit, hard=False).tolist() == [False, False]


def test_a_short_machine_kills_the_tasks_over_their_limits_lowest_priority_first() -> None:
    # Machine 0: three tasks 1 GiB over their limits, nothing unused: short by 3 GiB. One kill
    # frees 2 GiB (not enough), two free 4 GiB.
    machines = machines_of(0, 0, 0, 1, priority=[200, 100, 300, 0])
    running = np.array([True, True, True, True])
    usage = np.array([2.0, 2.0, 2.0, 2.0]) * GIB
    limit = np.array([1.0, 1.0, 1.0, 4.0]) * GIB
    killed = machines.memory_kills(running, usage, limit, hard=False)
    assert killed.tolist() == [True, True, False, False]  # priorities 100, 200 go; 300 stays


@pytest.mark.parametrize("limit", [np.nan, 0.0], ids=["nan", "zero"])
def test_a_task_without_a_limit_reserves_what_it_uses(limit: float) -> None:
    machines = machines_of(0, 0)
    running = np.array([True, True])
    usage = np.array([5.0, 2.0]) * GIB
    limits = np.array([limit, 1.0 * GIB])
    # The unlimited task neither dies nor leaves room: the task over its soft limit does.
    assert machines.memory_kills(running, usage, limits, hard=False).tolist() == [False, True]


def test_tasks_not_running_neither_use_nor_reserve() -> None:
    machines = machines_of(0, 0)
    running = np.array([True, False])
    usage = np.array([2.0, 0.0]) * GIB
    limit = np.array([1.0, 8.0]) * GIB
    assert machines.memory_kills(running, usage, limit, hard=False).tolist() == [True, False]


def test_free_memory_covers_an_overage() -> None:
    machines = ReplayMachines(
        machine=np.zeros(1, dtype=np.intp), count=1, priority=np.zeros(1, dtype=np.int64), free_bytes=2 * GIB
    )
    running = np.array([True])
    assert not machines.memory_kills(running, np.array([2.5 * GIB]), np.array([1.0 * GIB]), hard=False)[0]
    assert machines.memory_kills(running, np.array([3.5 * GIB]), np.array([1.0 * GIB]), hard=False)[0]


def test_cell_model_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="pool_jobs"):
        CellModel(pool_jobs=0)
    with pytest.raises(ValueError, match="free_fraction"):
        CellModel(free_fraction=1.5)
