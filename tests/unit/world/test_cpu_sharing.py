"""A machine shares its CPU (cellpilot.world.enforcement.share_cpu): bursting into spare CPU,
latency-sensitive before batch under contention, unmet demand measured (Borg §6.2, Autopilot §2.3)."""

from __future__ import annotations

import numpy as np
import pytest

from cellpilot.world.enforcement import MachineCapacity, TaskUsage, enforce_limits, share_cpu

GIB = float(1 << 30)


def _tasks(
    demand: list[float],
    limit: list[float],
    ls: list[bool],
    machine: list[int] | None = None,
    measured: list[bool] | None = None,
) -> TaskUsage:
    n = len(demand)
    return TaskUsage(
        machine=np.array(machine or [0] * n, dtype=np.intp),
        priority=np.zeros(n, dtype=np.int64),
        cpu_millicores=np.array(demand, dtype=np.float64),
        memory_bytes=np.zeros(n),
        cpu_limit_millicores=np.array(limit, dtype=np.float64),
        memory_limit_bytes=np.zeros(n),
        hard_memory_limit=np.ones(n, dtype=bool),
        latency_sensitive=np.array(ls, dtype=bool),
        cpu_measured=None if measured is None else np.array(measured, dtype=bool),
    )


def _machines(cpu: list[float]) -> MachineCapacity:
    return MachineCapacity(np.full(len(cpu), 64 * GIB), 1.0, np.array(cpu, dtype=np.float64))


@pytest.mark.parametrize(
    ("capacity", "granted", "unmet"),
    [
        # Plenty of spare: both burst beyond their 1000 m limits (Autopilot §2.3).
        (4000.0, [1500.0, 1500.0], [0.0, 0.0]),
        # Within-limit demand fits, then the LS task's burst; the batch burst gets nothing.
        (2500.0, [1500.0, 1000.0], [0.0, 500.0]),
        # Contention: limits are enforced, both at their limits.
        (2000.0, [1000.0, 1000.0], [500.0, 500.0]),
        # Overcommitted (batch in reclaimed resources, Borg §5.5): batch throttled below its limit.
        (1500.0, [1000.0, 500.0], [500.0, 1000.0]),
        # Not even the LS limit fits: batch gets nothing (LS tasks may starve batch, Borg §6.2).
        (800.0, [800.0, 0.0], [700.0, 1500.0]),
    ],
    ids=["spare", "ls-bursts", "at-limits", "batch-below-limit", "ls-starves-batch"],
)
def test_cpu_is_shared_by_tier_ls_first(capacity: float, granted: list[float], unmet: list[float]) -> None:
    tasks = _tasks([1500.0, 1500.0], [1000.0, 1000.0], [True, False])
    got, missing = share_cpu(tasks, _machines([capacity]))
    np.testing.assert_allclose(got, granted)
    np.testing.assert_allclose(missing, unmet)


def test_within_a_tier_short_capacity_is_shared_in_proportion_to_what_each_asks() -> None:
    tasks = _tasks([600.0, 300.0, 900.0], [1000.0, 1000.0, 1000.0], [True, True, True])
    got, missing = share_cpu(tasks, _machines([1200.0]))
    np.testing.assert_allclose(got, [400.0, 200.0, 600.0])
    np.testing.assert_allclose(missing, [200.0, 100.0, 300.0])


def test_measured_tasks_count_at_what_they_used_before_every_tier() -> None:
    # A real process used 900 m (already spent): the modelled task gets what is left of 1000.
    tasks = _tasks([900.0, 500.0], [500.0, 1000.0], [False, True], measured=[True, False])
    got, missing = share_cpu(tasks, _machines([1000.0]))
    np.testing.assert_allclose(got, [900.0, 100.0])
    np.testing.assert_allclose(missing, [0.0, 400.0])


def test_without_a_machine_capacity_cpu_is_capped_at_the_limit() -> None:
    tasks = _tasks([1500.0, 400.0, 700.0], [1000.0, 1000.0, 0.0], [True, False, True])
    got, missing = share_cpu(tasks, MachineCapacity(np.full(1, GIB)))
    np.testing.assert_allclose(got, [1000.0, 400.0, 700.0])
    np.testing.assert_allclose(missing, [500.0, 0.0, 0.0])


def test_machines_share_independently() -> None:
    tasks = _tasks([1500.0, 1500.0], [1000.0, 1000.0], [True, True], machine=[0, 1])
    got, _ = share_cpu(tasks, _machines([4000.0, 1000.0]))
    np.testing.assert_allclose(got, [1500.0, 1000.0])


@pytest.mark.parametrize("seed", range(8))
def test_sharing_is_work_conserving_and_ls_within_limits_go_first(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, machines = 40, 4
    demand = rng.gamma(2.0, 500.0, n)
    limit = np.where(rng.random(n) < 0.1, 0.0, rng.uniform(200.0, 2000.0, n))
    ls = rng.random(n) < 0.5
    machine = np.sort(rng.integers(0, machines, n))
    capacity = rng.uniform(2000.0, 15000.0, machines)
    tasks = _tasks(demand.tolist(), limit.tolist(), ls.tolist(), machine.tolist())
    got, missing = share_cpu(tasks, _machines(capacity.tolist()))
    np.testing.assert_allclose(got + missing, demand)
    assert (got >= -1e-9).all()
    assert (missing >= -1e-9).all()
    used = np.bincount(machine, weights=got, minlength=machines)
    wanted = np.bincount(machine, weights=demand, minlength=machines)
    np.testing.assert_allclose(used, np.minimum(capacity, wanted))  # never idle while demand waits
    within = np.where(limit > 0, np.minimum(demand, limit), demand)
    for m in range(machines):
        on = machine == m
        ls_short = (got < within - 1e-6) & ls & on
        if ls_short.any():  # an LS task short of its limit: no batch task got anything
            assert np.allclose(got[on & ~ls], 0.0)


def test_enforcement_reports_unmet_demand_and_throttled_tasks() -> None:
    tasks = _tasks([1500.0, 1500.0, 100.0], [1000.0, 1000.0, 1000.0], [True, False, False])
    decision = enforce_limits(tasks, _machines([2500.0]), now_ms=0)
    # Limits first (1000 + 1000 + 100), then the LS burst gets the 400 left; batch bursts get none.
    np.testing.assert_allclose(decision.cpu_granted_millicores, [1400.0, 1000.0, 100.0])
    np.testing.assert_allclose(decision.cpu_unmet_millicores, [100.0, 500.0, 0.0])
    assert decision.cpu_throttled.tolist() == [True, True, False]
