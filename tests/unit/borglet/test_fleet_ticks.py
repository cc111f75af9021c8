"""One event-time step over a fleet's tasks (cellpilot_services.borglet.fleet_ticks)."""

from __future__ import annotations

import numpy as np

from cellpilot.borg.enforcement import KillReason
from cellpilot.workloads.usage_models import evaluate_usage, resolve_params
from cellpilot_services.borglet.fleet_ticks import (
    ProcessUsage,
    SimulatedGroup,
    TaskTable,
    empty_usage,
    run_ticks,
)

MIB = 1 << 20
T0 = 1_700_000_000


def _table(
    machine: list[int],
    memory_limit: list[float],
    hard: list[bool],
    simulated: list[bool],
    groups: tuple[SimulatedGroup, ...],
    capacity: list[float],
    start_s: list[float] | None = None,
    duration_s: list[float] | None = None,
    cpu_limit: list[float] | None = None,
    priority: list[int] | None = None,
) -> TaskTable:
    n = len(machine)
    m = np.array(machine, dtype=np.intp)
    return TaskTable(
        machine=m,
        priority=np.array(priority or [0] * n, dtype=np.int64),
        cpu_limit=np.array(cpu_limit or [0.0] * n),
        memory_limit=np.array(memory_limit, dtype=np.float64),
        hard_memory_limit=np.array(hard, dtype=bool),
        simulated=np.array(simulated, dtype=bool),
        start_s=np.array(start_s or [T0 - 100.0] * n),
        duration_s=np.array(duration_s or [0.0] * n),
        groups=groups,
        memory_capacity=np.array(capacity, dtype=np.float64),
        pressure_fraction=1.0,
        machine_bounds=TaskTable.bounds(m, len(capacity)),
    )


def _leak_group(rows: list[int], rate: float) -> SimulatedGroup:
    params = resolve_params(
        "leak",
        {
            "memory_start_bytes": 100 * MIB,
            "leak_bytes_per_second": rate,
            "cpu_noise": 0,
            "cpu_millicores": 800,
        },
    )
    return SimulatedGroup("leak", params, np.array(rows, dtype=np.intp), np.array(rows, dtype=np.int64))


def test_every_running_task_is_sampled_every_second_with_its_model_usage() -> None:
    group = _leak_group([0, 1], 1 * MIB)
    table = _table([0, 1], [0, 0], [True, True], [True, True], (group,), [1e12, 1e12])
    seconds = np.arange(T0, T0 + 5)
    result = run_ticks(table, seconds, empty_usage(2))
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
    table = _table([0], [190 * MIB], [True], [True], (group,), [1e12], start_s=[float(T0)])
    result = run_ticks(table, np.arange(T0, T0 + 20), empty_usage(1))
    assert [(k.row, k.second, k.reason) for k in result.kills] == [(0, T0 + 10, KillReason.HARD_LIMIT)]
    assert result.sampled[:, 0].tolist() == [True] * 11 + [False] * 9


def test_sampling_starts_at_the_first_whole_second_after_the_start_and_ends_after_the_duration() -> None:
    group = _leak_group([0], 0)
    table = _table([0], [0], [True], [True], (group,), [1e12], start_s=[T0 + 2.5], duration_s=[3.0])
    result = run_ticks(table, np.arange(T0, T0 + 10), empty_usage(1))
    # Starts at T0 + 2.5: sampled at T0 + 3, 4, 5; at T0 + 6 its age is 3.5 >= 3 s: finished.
    assert np.flatnonzero(result.sampled[:, 0]).tolist() == [3, 4, 5]
    assert result.finished == ((0, T0 + 6),)


def test_process_tasks_report_what_they_used_and_are_recorded_as_throttled() -> None:
    group = _leak_group([1], 0)
    table = _table([0, 0], [0, 0], [True, True], [False, True], (group,), [1e12], cpu_limit=[500.0, 300.0])
    process = ProcessUsage(np.array([900.0, 0.0]), np.array([50.0 * MIB, 0.0]), np.array([False, False]))
    result = run_ticks(table, np.arange(T0, T0 + 2), process)
    # The process ran at 900 millicores: reported as measured, flagged as over its limit.
    assert result.cpu[:, 0].tolist() == [900.0, 900.0]
    assert result.throttled[:, 0].all()
    assert (result.memory[:, 0] == 50 * MIB).all()
    # The simulated task (800 demanded) is throttled to its 300 limit by the simulated kernel.
    assert result.cpu[:, 1].tolist() == [300.0, 300.0]
    assert result.throttled[:, 1].all()


def test_pressure_kill_on_one_machine_leaves_the_other_alone() -> None:
    group = _leak_group([0, 1, 2], 0)  # 100 MiB each
    table = _table(
        [0, 0, 1],
        [50 * MIB] * 3,
        [False] * 3,
        [True] * 3,
        (group,),
        [150 * MIB, 150 * MIB],
        priority=[3, 1, 0],
    )
    result = run_ticks(table, np.arange(T0, T0 + 3), empty_usage(3))
    assert [(k.row, k.second, k.reason) for k in result.kills] == [(1, T0, KillReason.SOFT_LIMIT_PRESSURE)]
    # At the last second the kill has relieved machine 0: 100 MiB used on each machine.
    assert result.memory_pressure.tolist() == [False, False]
    assert result.memory_used.tolist() == [100 * MIB, 100 * MIB]
    assert result.sampled[:, 0].all()
    assert result.sampled[:, 2].all()
    assert result.sampled[:, 1].tolist() == [True, False, False]
