"""Limit enforcement (cellpilot.world.enforcement): OOM kills and CPU throttling.

Expected kills are worked out by hand in the tables, and for random machines by a plain
per-task Python reference written from the rules in the module docstring (Autopilot §2.3,
Borg §5.5, §6.2), not from the vectorised code.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cellpilot.world.enforcement import KillReason, MachineCapacity, TaskUsage, enforce_limits

MIB = 1 << 20
H, S = True, False  # hard / soft memory limit
HARD, SOFT, OOM = KillReason.HARD_LIMIT, KillReason.SOFT_LIMIT_PRESSURE, KillReason.MACHINE_OUT_OF_MEMORY


@dataclass(frozen=True)
class T:
    """A task: priority, memory used, memory limit (0 = none), hard limit?"""

    priority: int
    memory: float
    limit: float
    hard: bool
    machine: int = 0


def _usage(tasks: list[T]) -> TaskUsage:
    return TaskUsage(
        machine=np.array([t.machine for t in tasks], dtype=np.intp),
        priority=np.array([t.priority for t in tasks], dtype=np.int64),
        cpu_millicores=np.zeros(len(tasks)),
        memory_bytes=np.array([t.memory for t in tasks], dtype=np.float64),
        cpu_limit_millicores=np.zeros(len(tasks)),
        memory_limit_bytes=np.array([t.limit for t in tasks], dtype=np.float64),
        hard_memory_limit=np.array([t.hard for t in tasks], dtype=bool),
    )


CASES = [
    # (tasks, capacity, pressure fraction, expected kills in order as (task, reason))
    ([T(5, 120, 100, H), T(1, 10, 100, S)], 1000, 1.0, [(0, HARD)]),
    ([T(5, 120, 100, S), T(1, 10, 100, S)], 1000, 1.0, []),
    ([T(5, 100, 100, H)], 1000, 1.0, []),  # at the limit is not over it
    # 300 + 200 + 100 = 600 > 500: short by 100; over-limit tasks 0 and 1, lowest priority (1) first.
    ([T(2, 300, 50, S), T(5, 200, 50, S), T(1, 100, 300, S)], 500, 1.0, [(0, SOFT)]),
    # Same, but the priorities swapped: task 1 goes first, frees 200 >= 100.
    ([T(5, 300, 50, S), T(2, 200, 50, S), T(1, 100, 300, S)], 500, 1.0, [(1, SOFT)]),
    # Over-limit tasks first regardless of priority (Borg §5.5): task 1 (prio 9, over) before
    # task 0 (prio 0, within its limit).
    ([T(0, 300, 400, S), T(9, 250, 200, S)], 500, 1.0, [(1, SOFT)]),
    # Short by 300: the over-limit task frees only 100, then within-limit tasks lowest priority first.
    ([T(3, 100, 50, S), T(1, 200, 300, S), T(2, 300, 400, S)], 300, 1.0, [(0, SOFT), (1, OOM)]),
    # A hard kill frees enough memory: no pressure kills afterwards.
    ([T(9, 400, 100, H), T(1, 300, 100, S)], 600, 1.0, [(0, HARD)]),
    # Pressure threshold below capacity: 0.8 * 500 = 400 < 450 used.
    ([T(1, 250, 100, S), T(2, 200, 100, S)], 500, 0.8, [(0, SOFT)]),
    ([T(1, 250, 100, S), T(2, 200, 100, S)], 500, 0.95, []),
    # No limit (0): never over it; killed only as a last resort.
    ([T(1, 900, 0, H), T(2, 200, 0, S)], 1000, 1.0, [(0, OOM)]),
    # Same priority: the one using more memory goes first (fewest kills).
    ([T(4, 150, 50, S), T(4, 350, 50, S), T(4, 200, 50, S)], 500, 1.0, [(1, SOFT)]),
    # Tasks using no memory are never killed for it.
    ([T(0, 0, 0, S), T(5, 700, 0, S)], 500, 1.0, [(1, OOM)]),
    # Two machines: only the short one kills.
    ([T(1, 300, 100, S, 0), T(1, 300, 100, S, 1), T(2, 300, 100, S, 1)], 500, 1.0, [(1, SOFT)]),
    # Two short machines: each frees its own shortage (memory freed on one never counts on another).
    (
        [T(1, 300, 100, S, 0), T(2, 300, 100, S, 0), T(1, 300, 100, S, 1), T(2, 300, 100, S, 1)],
        500,
        1.0,
        [(0, SOFT), (2, SOFT)],
    ),
]
IDS = [
    "hard-over-limit-killed-with-room",
    "soft-over-limit-left-without-pressure",
    "at-limit-not-over",
    "pressure-kills-lowest-priority-over-limit",
    "pressure-order-follows-priority",
    "over-limit-before-lower-priority-within-limit",
    "within-limit-killed-when-over-limit-not-enough",
    "hard-kill-relieves-pressure",
    "pressure-fraction-below-capacity",
    "under-pressure-fraction-no-kill",
    "zero-limit-means-none",
    "equal-priority-largest-first",
    "zero-memory-never-killed",
    "machines-independent",
    "two-short-machines",
]


@pytest.mark.parametrize(("tasks", "capacity", "fraction", "expected"), CASES, ids=IDS)
def test_memory_kills(
    tasks: list[T], capacity: float, fraction: float, expected: list[tuple[int, KillReason]]
) -> None:
    machines = max(t.machine for t in tasks) + 1
    decision = enforce_limits(
        _usage(tasks), MachineCapacity(np.full(machines, float(capacity)), fraction), now_ms=7
    )
    assert [(k.task, k.reason) for k in decision.kills] == expected
    reasons = [KillReason.NONE] * len(tasks)
    for task, reason in expected:
        reasons[task] = reason
    assert decision.kill_reason.tolist() == reasons
    assert decision.now_ms == 7
    for kill in decision.kills:
        assert kill.detail  # a reason a person can read


def test_memory_pressure_and_remaining_memory_per_machine() -> None:
    tasks = [T(1, 300, 100, S, 0), T(1, 300, 100, S, 1), T(2, 300, 100, S, 1)]
    decision = enforce_limits(_usage(tasks), MachineCapacity(np.array([500.0, 500.0])), now_ms=0)
    assert decision.memory_used_bytes.tolist() == [300.0, 600.0]
    assert decision.memory_pressure.tolist() == [False, True]
    assert decision.memory_after_bytes.tolist() == [300.0, 300.0]


@pytest.mark.parametrize(
    ("demand", "limit", "granted", "throttled"),
    [
        (500.0, 1000.0, 500.0, False),
        (1500.0, 1000.0, 1000.0, True),
        (1000.0, 1000.0, 1000.0, False),
        (3000.0, 0.0, 3000.0, False),
    ],
    ids=["under", "over-throttled", "at-limit", "no-limit"],
)
def test_cpu_is_throttled_at_the_limit_never_killed(
    demand: float, limit: float, granted: float, throttled: bool
) -> None:
    tasks = TaskUsage.single_machine(5, demand, 10 * MIB, limit, 100 * MIB, True)
    decision = enforce_limits(tasks, MachineCapacity(np.array([1e12])), now_ms=0)
    assert decision.cpu_granted_millicores.tolist() == [granted]
    assert decision.cpu_throttled.tolist() == [throttled]
    assert decision.kills == ()


def test_pressure_fraction_must_be_a_fraction() -> None:
    with pytest.raises(ValueError, match="pressure_fraction"):
        MachineCapacity(np.array([1.0]), pressure_fraction=1.5)


def test_no_tasks() -> None:
    empty = TaskUsage.single_machine([], [], [], [], [], [])
    decision = enforce_limits(empty, MachineCapacity(np.array([100.0])), now_ms=0)
    assert decision.kills == ()
    assert decision.memory_pressure.tolist() == [False]


def _reference(tasks: list[T], capacity: list[float], fraction: float) -> list[tuple[int, KillReason]]:
    """The rules, one task at a time, in plain Python."""
    kills: list[tuple[int, KillReason]] = []
    for i, t in enumerate(tasks):
        if t.hard and t.limit > 0 and t.memory > t.limit:
            kills.append((i, HARD))
    dead = {i for i, _ in kills}
    for m, cap in enumerate(capacity):
        mine = [i for i, t in enumerate(tasks) if t.machine == m and i not in dead]
        used = sum(tasks[i].memory for i in mine)
        threshold = fraction * cap
        if used <= threshold:
            continue

        def over(i: int) -> bool:
            return tasks[i].limit > 0 and tasks[i].memory > tasks[i].limit

        order = sorted(
            (i for i in mine if tasks[i].memory > 0),
            key=lambda i: (0 if over(i) else 1, tasks[i].priority, -tasks[i].memory, i),
        )
        for i in order:
            if used <= threshold:
                break
            kills.append((i, SOFT if over(i) else OOM))
            used -= tasks[i].memory
    return kills


task_strategy = st.builds(
    T,
    priority=st.integers(0, 11),
    memory=st.integers(0, 64).map(float),
    limit=st.integers(0, 48).map(float),
    hard=st.booleans(),
    machine=st.integers(0, 2),
)


@settings(max_examples=300, deadline=None)
@given(
    tasks=st.lists(task_strategy, max_size=25),
    capacity=st.lists(st.integers(1, 300).map(float), min_size=3, max_size=3),
    fraction=st.sampled_from([1.0, 0.9, 0.5]),
)
def test_matches_the_one_task_at_a_time_reference(
    tasks: list[T], capacity: list[float], fraction: float
) -> None:
    decision = enforce_limits(_usage(tasks), MachineCapacity(np.array(capacity), fraction), now_ms=0)
    assert sorted((k.task, k.reason) for k in decision.kills) == sorted(_reference(tasks, capacity, fraction))
    # Invariants: each machine ends at or under its threshold unless nothing with memory is left,
    # and the memory left is what the survivors use.
    alive = ~decision.killed
    for m in range(3):
        mine = [i for i, t in enumerate(tasks) if t.machine == m]
        left = sum(tasks[i].memory for i in mine if alive[i])
        assert decision.memory_after_bytes[m] == pytest.approx(left)
        if left > fraction * capacity[m]:
            assert all(tasks[i].memory == 0 for i in mine if alive[i])
