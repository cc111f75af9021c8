"""The world one step at a time (cellpilot.world.step): base usage plus the job's shared
demand, CPU sharing and OOM enforcement per second, over many machines at once."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from cellpilot.world.enforcement import KillReason
from cellpilot.world.job_demand import JobDemand
from cellpilot.world.step import DemandGroup, MeasuredUsage, UsageGroup, WorldTasks, step_world
from cellpilot.world.usage_models import evaluate_usage, resolve_params

MIB = 1 << 20
GIB = float(1 << 30)
T0 = 1_700_000_000
QUIET = {"cpu_noise": 0.0, "memory_noise": 0.0}


def _table(
    machine: list[int],
    memory_limit: list[float],
    hard: list[bool],
    groups: tuple[UsageGroup, ...],
    capacity: list[float],
    *,
    measured: list[bool] | None = None,
    start_s: list[float] | None = None,
    duration_s: list[float] | None = None,
    cpu_limit: list[float] | None = None,
    priority: list[int] | None = None,
    ls: list[bool] | None = None,
    cpu_capacity: list[float] | None = None,
    demands: tuple[DemandGroup, ...] = (),
) -> WorldTasks:
    n = len(machine)
    m = np.array(machine, dtype=np.intp)
    return WorldTasks(
        machine=m,
        priority=np.array(priority or [0] * n, dtype=np.int64),
        latency_sensitive=np.array(ls or [True] * n, dtype=bool),
        cpu_limit=np.array(cpu_limit or [0.0] * n),
        memory_limit=np.array(memory_limit, dtype=np.float64),
        hard_memory_limit=np.array(hard, dtype=bool),
        measured=np.array(measured or [False] * n, dtype=bool),
        start_s=np.array(start_s or [T0 - 100.0] * n),
        duration_s=np.array(duration_s or [0.0] * n),
        groups=groups,
        memory_capacity=np.array(capacity, dtype=np.float64),
        pressure_fraction=1.0,
        machine_bounds=WorldTasks.bounds(m, len(capacity)),
        cpu_capacity=None if cpu_capacity is None else np.array(cpu_capacity, dtype=np.float64),
        demands=demands,
    )


def _leak_group(rows: list[int], rate: float, cpu: float = 800.0) -> UsageGroup:
    params = resolve_params(
        "leak",
        {
            "memory_start_bytes": 100 * MIB,
            "leak_bytes_per_second": rate,
            "cpu_noise": 0,
            "cpu_millicores": cpu,
        },
    )
    return UsageGroup("leak", params, np.array(rows, dtype=np.intp), np.array(rows, dtype=np.int64))


def _base(rows: Sequence[int], cpu: float = 50.0, memory: float = 100 * MIB) -> UsageGroup:
    params = resolve_params("steady", {"cpu_millicores": cpu, "memory_bytes": memory, **QUIET})
    return UsageGroup("steady", params, np.array(rows, dtype=np.intp), np.array(rows, dtype=np.int64))


def _demand(
    rows: Sequence[int], routed_from: Sequence[float], cpu: float = 3000.0, **kwargs: float
) -> DemandGroup:
    demand = JobDemand.build("steady", {"cpu_millicores": cpu, "memory_bytes": 300 * MIB, **QUIET}, seed=9)
    return DemandGroup(
        demand=demand,
        origin_s=float(T0 - 100),
        rows=np.array(rows, dtype=np.intp),
        task_index=np.array(rows, dtype=np.int64),
        routed_from_s=np.array(routed_from, dtype=np.float64),
        **kwargs,  # type: ignore[arg-type]
    )


def test_every_running_task_is_sampled_every_second_with_its_model_usage() -> None:
    group = _leak_group([0, 1], 1 * MIB)
    table = _table([0, 1], [0, 0], [True, True], (group,), [1e12, 1e12])
    seconds = np.arange(T0, T0 + 5)
    result = step_world(table, seconds)
    assert result.sampled.all()
    expected_cpu, expected_memory = evaluate_usage(
        "leak", group.params, 0, [0, 1], seconds[:, None], T0 - 100.0
    )
    np.testing.assert_array_equal(result.memory, expected_memory)
    np.testing.assert_array_equal(result.cpu, expected_cpu)
    assert result.kills == ()


def test_a_task_killed_at_a_second_is_not_sampled_after_it() -> None:
    # Started at T0 with 100 MiB, +10 MiB/s: over its 190 MiB hard limit at T0 + 10 (200 MiB).
    group = _leak_group([0], 10 * MIB)
    table = _table([0], [190 * MIB], [True], (group,), [1e12], start_s=[float(T0)])
    result = step_world(table, np.arange(T0, T0 + 20))
    assert [(k.row, k.second, k.reason) for k in result.kills] == [(0, T0 + 10, KillReason.HARD_LIMIT)]
    assert result.sampled[:, 0].tolist() == [True] * 11 + [False] * 9


def test_sampling_starts_at_the_first_whole_second_after_the_start_and_ends_after_the_duration() -> None:
    group = _leak_group([0], 0)
    table = _table([0], [0], [True], (group,), [1e12], start_s=[T0 + 2.5], duration_s=[3.0])
    result = step_world(table, np.arange(T0, T0 + 10))
    # Starts at T0 + 2.5: sampled at T0 + 3, 4, 5; at T0 + 6 its age is 3.5 >= 3 s: finished.
    assert np.flatnonzero(result.sampled[:, 0]).tolist() == [3, 4, 5]
    assert result.finished == ((0, T0 + 6),)


def test_processes_report_what_they_used_and_their_kernel_throttling_as_unmet_demand() -> None:
    group = _leak_group([1], 0)
    table = _table(
        [0, 0], [0, 0], [True, True], (group,), [1e12], measured=[True, False], cpu_limit=[500.0, 300.0]
    )
    measured = MeasuredUsage(
        np.array([900.0, 0.0]), np.array([50.0 * MIB, 0.0]), np.array([True, False]), np.array([120.0, 0.0])
    )
    result = step_world(table, np.arange(T0, T0 + 2), measured)
    # The process ran at 900 millicores (no cgroup caps it here): reported as measured, and
    # its unmet demand is what the kernel held it throttled.
    assert result.cpu[:, 0].tolist() == [900.0, 900.0]
    assert result.cpu_unmet[:, 0].tolist() == [120.0, 120.0]
    assert result.throttled[:, 0].all()
    assert (result.memory[:, 0] == 50 * MIB).all()
    # The simulated task (800 demanded) is capped at its 300 limit: no machine CPU capacity given.
    assert result.cpu[:, 1].tolist() == [300.0, 300.0]
    assert result.cpu_unmet[:, 1].tolist() == [500.0, 500.0]
    assert result.throttled[:, 1].all()


def test_pressure_kill_on_one_machine_leaves_the_other_alone() -> None:
    group = _leak_group([0, 1, 2], 0)  # 100 MiB each
    table = _table(
        [0, 0, 1], [50 * MIB] * 3, [False] * 3, (group,), [150 * MIB, 150 * MIB], priority=[3, 1, 0]
    )
    result = step_world(table, np.arange(T0, T0 + 3))
    assert [(k.row, k.second, k.reason) for k in result.kills] == [(1, T0, KillReason.SOFT_LIMIT_PRESSURE)]
    # At the last second the kill has relieved machine 0: 100 MiB used on each machine.
    assert result.memory_pressure.tolist() == [False, False]
    assert result.memory_used.tolist() == [100 * MIB, 100 * MIB]
    assert result.sampled[:, 0].all()
    assert result.sampled[:, 2].all()
    assert result.sampled[:, 1].tolist() == [True, False, False]


def test_a_usage_model_that_cannot_be_evaluated_fails_its_tasks_and_no_others() -> None:
    good = _leak_group([0, 2], 0)
    # A group whose model is not in the registry (a plan the admission checks would refuse):
    # evaluating it raises. Its rows fail; the good group is sampled and enforced as usual.
    bad = UsageGroup("nope", {}, np.array([1], dtype=np.intp), np.array([1], dtype=np.int64))
    huge = UsageGroup(
        "steady",
        resolve_params("steady", {"memory_bytes": 1e300}),
        np.array([3], dtype=np.intp),
        np.array([3], dtype=np.int64),
    )
    table = _table([0, 0, 1, 1], [0] * 4, [True] * 4, (good, bad, huge), [1e12, 1e12])
    with np.errstate(invalid="ignore"):
        result = step_world(table, np.arange(T0, T0 + 3))
    assert [row for row, _ in result.failed] == [1, 3]
    assert "unknown usage model 'nope'" in result.failed[0][1]
    assert "finite" in result.failed[1][1]
    assert result.sampled[:, [0, 2]].all()
    assert not result.sampled[:, [1, 3]].any()
    assert result.kills == ()


def test_a_task_becoming_ready_takes_its_share_and_lowers_the_others() -> None:
    # Three tasks of one job, base 50 m each; the third finishes its start-up at T0 + 5.
    never = -float("inf")
    demand = _demand([0, 1, 2], [never, never, T0 + 5])
    table = _table([0, 0, 1], [0] * 3, [True] * 3, (_base([0, 1, 2]),), [1e12, 1e12], demands=(demand,))
    result = step_world(table, np.arange(T0, T0 + 10))
    np.testing.assert_allclose(result.cpu[:5], [[1550.0, 1550.0, 50.0]] * 5)
    np.testing.assert_allclose(result.cpu[5:], [[1050.0, 1050.0, 1050.0]] * 5)
    # The job's demand is conserved: the shares always add up to it (bases aside).
    np.testing.assert_allclose(result.cpu.sum(axis=1) - 150.0, 3000.0)
    np.testing.assert_allclose(result.memory[5:, 2], 100 * MIB + 100 * MIB)
    assert (result.unrouted_cpu == 0).all()


def test_routed_tasks_elsewhere_keep_this_borglets_shares_to_theirs() -> None:
    # Two tasks here, two more routed on another Borglet: each task here takes a quarter.
    demand = _demand([0, 1], [-np.inf, -np.inf], other_weight=2.0)
    table = _table([0, 0], [0, 0], [True, True], (_base([0, 1], cpu=0.0),), [1e12], demands=(demand,))
    result = step_world(table, np.arange(T0, T0 + 2))
    np.testing.assert_allclose(result.cpu, 750.0)


@pytest.mark.parametrize(
    ("capacity", "served", "unmet"),
    [(8000.0, [1550.0, 1550.0], [0.0, 0.0]), (2400.0, [1200.0, 1200.0], [350.0, 350.0])],
    ids=["bursts-into-spare", "contention"],
)
def test_unmet_demand_is_what_the_machine_did_not_serve_each_second(
    capacity: float, served: list[float], unmet: list[float]
) -> None:
    demand = _demand([0, 1], [-np.inf, -np.inf])
    table = _table(
        [0, 0],
        [0, 0],
        [True, True],
        (_base([0, 1]),),
        [1e12],
        cpu_limit=[1000.0, 1000.0],
        cpu_capacity=[capacity],
        demands=(demand,),
    )
    seconds = np.arange(T0, T0 + 60)
    result = step_world(table, seconds)
    np.testing.assert_allclose(result.cpu, [served] * 60)
    np.testing.assert_allclose(result.cpu_unmet, [unmet] * 60)
    np.testing.assert_allclose(result.cpu + result.cpu_unmet, result.cpu_demand)
    # Throttled CPU-seconds over the minute: the unmet demand of every second, summed.
    throttled_cpu_seconds = result.cpu_unmet.sum() / 1000.0
    assert throttled_cpu_seconds == pytest.approx(sum(unmet) * 60 / 1000.0)
    assert result.throttled.all() == (sum(unmet) > 0)


def test_batch_tasks_are_throttled_before_latency_sensitive_ones_on_a_busy_machine() -> None:
    table = _table(
        [0, 0],
        [0, 0],
        [True, True],
        (_base([0], cpu=1800.0), _base([1], cpu=1800.0)),
        [1e12],
        cpu_limit=[1000.0, 1000.0],
        ls=[True, False],
        cpu_capacity=[2500.0],
    )
    result = step_world(table, np.arange(T0, T0 + 3))
    np.testing.assert_allclose(result.cpu[0], [1500.0, 1000.0])
    np.testing.assert_allclose(result.cpu_unmet[0], [300.0, 800.0])


def test_a_job_demand_that_cannot_be_evaluated_fails_its_tasks_alone() -> None:
    bad = DemandGroup(
        demand=JobDemand("nope", (), None, 0.0, 0),
        origin_s=0.0,
        rows=np.array([1], dtype=np.intp),
        task_index=np.array([0], dtype=np.int64),
        routed_from_s=np.array([-np.inf]),
    )
    table = _table([0, 0], [0, 0], [True, True], (_base([0, 1]),), [1e12], demands=(bad,))
    result = step_world(table, np.arange(T0, T0 + 2))
    assert [row for row, _ in result.failed] == [1]
    assert "job demand failed" in result.failed[0][1]
    assert result.sampled[:, 0].all()
    assert not result.sampled[:, 1].any()


def test_a_study_steps_one_job_through_a_window_and_sees_served_and_unmet_cpu() -> None:
    # Three tasks of a job on one 2.5-core machine; the third is past its start-up at T0 + 60.
    demand = JobDemand.build("steady", {"cpu_millicores": 3000.0, **QUIET}, seed=4)
    table = WorldTasks.for_job(
        demand,
        "steady",
        resolve_params("steady", {"cpu_millicores": 0.0, **QUIET}),
        task_index=[0, 1, 2],
        start_s=T0 - 600.0,
        routed_from_s=[-np.inf, -np.inf, T0 + 60.0],
        cpu_limit=1000.0,
        memory_limit=GIB,
        machine=[0, 0, 0],
        machine_cpu=2500.0,
    )
    result = step_world(table, np.arange(T0, T0 + 300))
    # Two tasks asked 1.5 cores each on 2.5: each got 1.25 (their limits, then an even burst).
    np.testing.assert_allclose(result.cpu[0], [1250.0, 1250.0, 0.0])
    np.testing.assert_allclose(result.cpu_unmet[0], [250.0, 250.0, 0.0])
    # Then three asked 1 core each (their limits): 2.5 cores shared evenly among them.
    np.testing.assert_allclose(result.cpu[-1], [2500.0 / 3] * 3)
    np.testing.assert_allclose(result.cpu_unmet[-1], [500.0 / 3] * 3)
    # The machine was 0.5 core short every second: 150 throttled CPU-seconds over the window.
    assert result.cpu_unmet.sum() / 1000.0 == pytest.approx(300 * 0.5)
