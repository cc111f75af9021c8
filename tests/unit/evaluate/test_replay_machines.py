"""The replay's machines: placement per pool, and kills by the Borglet's enforcement, in the
reservation-free cell (overcommit 1) and in overcommitted ones (Borg §5.5)."""

from __future__ import annotations

import numpy as np
import pytest

from cellpilot.evaluate.replay_machines import (
    BORG_OVERCOMMIT,
    CELL_MODELS,
    DEFAULT_CELL,
    CellModel,
    ReplayMachines,
    place_tasks,
    pools_of,
)

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
    with pytest.raises(ValueError, match="overcommit"):
        CellModel(overcommit=0.9)


def test_the_named_cells() -> None:
    assert CELL_MODELS["none"].overcommit == 1.0
    assert CELL_MODELS[DEFAULT_CELL] == CellModel() == CellModel(overcommit=BORG_OVERCOMMIT)
    assert 1.0 < CELL_MODELS["borg"].overcommit < CELL_MODELS["tight"].overcommit


def one_machine(
    priority: list[int], overcommit: float = BORG_OVERCOMMIT, memory: float = 10 * GIB
) -> ReplayMachines:
    n = len(priority)
    return ReplayMachines(
        machine=np.zeros(n, dtype=np.intp),
        count=1,
        priority=np.array(priority, dtype=np.int64),
        free_bytes=0.0,
        memory_bytes=memory,
        overcommit=overcommit,
    )


# A full 10 GiB machine at overcommit 1.25: limits of 6 and 6.5 GiB, reservations 4.8 + 5.2 GiB.
FULL_LIMITS = np.array([6.0, 6.5]) * GIB
BOTH = np.array([True, True])


def test_a_task_over_its_soft_limit_on_a_machine_with_room_is_not_killed() -> None:
    usage = np.array([7.0, 2.0]) * GIB  # 9 GiB used of 10: the machine has room
    machines = one_machine([0, 0])
    assert machines.memory_kills(BOTH, usage, FULL_LIMITS, hard=False).tolist() == [False, False]
    assert not machines.short(BOTH, usage, FULL_LIMITS)[0]


def test_a_task_over_its_soft_limit_on_a_full_machine_is_killed() -> None:
    usage = np.array([7.0, 5.0]) * GIB  # 12 GiB used of 10: out of memory
    machines = one_machine([100, 0])
    # The task over its limit goes first, whatever its priority; that covers the shortage.
    assert machines.memory_kills(BOTH, usage, FULL_LIMITS, hard=False).tolist() == [True, False]
    assert machines.short(BOTH, usage, FULL_LIMITS)[0]
    # Without overcommit the neighbour's unused 1.5 GiB of limit covers the 1 GiB overage.
    roomy = one_machine([100, 0], overcommit=1.0, memory=12.5 * GIB)
    assert roomy.memory_kills(BOTH, usage, FULL_LIMITS, hard=False).tolist() == [False, False]


@pytest.mark.parametrize("used", [2.0, 5.0], ids=["room", "full"])
def test_a_hard_limit_always_kills(used: float) -> None:
    usage = np.array([7.0, used]) * GIB
    machines = one_machine([0, 0])
    assert machines.memory_kills(BOTH, usage, FULL_LIMITS, hard=True).tolist() == [True, False]


def test_other_work_in_reclaimed_memory_goes_before_a_task_within_its_limit() -> None:
    # One task with an 8 GiB limit reserves 6.4 GiB; other work uses the other 3.6 GiB.
    machines = one_machine([0])
    one = np.array([True])
    limit = np.array([8.0 * GIB])
    # Using 7.9 GiB (within its limit) runs the machine out: the other work is killed, not the task.
    assert machines.short(one, np.array([7.9 * GIB]), limit)[0]
    assert not machines.memory_kills(one, np.array([7.9 * GIB]), limit, hard=False)[0]
    # Over its limit, it is the first to go.
    assert machines.memory_kills(one, np.array([8.5 * GIB]), limit, hard=False)[0]


def test_tasks_within_their_limits_die_only_when_they_alone_overflow_the_machine() -> None:
    usage = np.array([5.9, 5.5]) * GIB  # within 6 and 6.5 GiB, 11.4 GiB on a 10 GiB machine
    machines = one_machine([0, 0])
    # Same priority: the larger goes, which covers the shortage (Borg §6.2).
    assert machines.memory_kills(BOTH, usage, FULL_LIMITS, hard=False).tolist() == [True, False]


def test_without_overcommit_the_machine_size_changes_nothing() -> None:
    # overcommit 1: a task within its limit is never killed, so the other work never is either,
    # and the machine's memory does not matter (the reservation-free model).
    rng = np.random.default_rng(3)
    n = 40
    machine = rng.integers(0, 5, n).astype(np.intp)
    priority = rng.integers(0, 3, n).astype(np.int64)
    sized = ReplayMachines(machine, 5, priority, free_bytes=GIB, memory_bytes=64 * GIB, overcommit=1.0)
    unsized = ReplayMachines(machine, 5, priority, free_bytes=GIB)
    for _ in range(50):
        running = rng.random(n) < 0.9
        limit = np.where(rng.random(n) < 0.1, np.nan, rng.uniform(1, 4, n) * GIB)
        usage = rng.uniform(0.5, 5, n) * GIB
        for hard in (False, True):
            np.testing.assert_array_equal(
                sized.memory_kills(running, usage, limit, hard),
                unsized.memory_kills(running, usage, limit, hard),
            )
