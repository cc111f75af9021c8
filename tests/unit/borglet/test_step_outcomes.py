"""A step of event time read back in the Borglet's terms: latest usage and the tasks it ended."""

from __future__ import annotations

import dataclasses

import numpy as np
from borglet_plan_builders import task_plan

from cellpilot.borg.lifecycle import TaskEvent
from cellpilot.borglet.hosted_task import HostedTask, SimulatedPlan
from cellpilot.borglet.step_outcomes import KILL_EXIT_CODE, latest_usage, task_endings
from cellpilot.borglet.task_lifecycle import Phase
from cellpilot.world.enforcement import KillReason
from cellpilot.world.step import WorldKill, WorldStep


def _step(mask_rows: list[list[bool]], **changes: object) -> WorldStep:
    mask = np.array(mask_rows, dtype=bool)
    k, n = mask.shape
    cpu = np.arange(k * n, dtype=float).reshape(k, n) * 10.0
    step = WorldStep(
        seconds=np.arange(100, 100 + k, dtype=np.int64),
        cpu=cpu,
        cpu_demand=cpu,
        cpu_unmet=cpu / 10.0,
        memory=(np.arange(k * n, dtype=np.int64).reshape(k, n) + 1) * 1000,
        throttled=np.zeros((k, n), dtype=bool) | (cpu > 25.0),
        sampled=mask,
        finished=(),
        kills=(),
        failed=(),
        memory_pressure=np.zeros(1, dtype=bool),
        memory_used=np.zeros(1),
        unrouted_cpu=np.zeros((k, 0)),
    )
    return dataclasses.replace(step, **changes)  # type: ignore[arg-type]


def _records(count: int, duration: int = 0) -> list[HostedTask]:
    plan = task_plan()
    records = []
    for index in range(count):
        runtime = SimulatedPlan("steady", (), duration_seconds=duration)
        indexed = dataclasses.replace(plan, task_index=index, runtime=runtime)
        records.append(HostedTask("m1", indexed, Phase.RUNNING, 0))
    return records


def test_latest_usage_is_each_tasks_last_sampled_second_and_skips_unsampled_tasks() -> None:
    # three seconds, three tasks: task 0 sampled at all, task 1 only at the first, task 2 never
    result = _step([[True, True, False], [True, False, False], [True, False, False]])
    usage = {u.row: u for u in latest_usage(result)}
    assert sorted(usage) == [0, 1]
    assert usage[0].cpu_millicores == result.cpu[2, 0]
    assert usage[0].memory_bytes == result.memory[2, 0]
    assert usage[1].cpu_millicores == result.cpu[0, 1]
    assert usage[1].cpu_unmet_millicores == result.cpu_unmet[0, 1]
    assert usage[0].cpu_throttled is bool(result.throttled[2, 0])


def test_a_step_of_no_seconds_has_no_usage() -> None:
    assert latest_usage(_step([[True]], sampled=np.zeros((0, 1), bool))) == []


def test_endings_come_finished_then_failed_then_killed_with_their_causes_and_times() -> None:
    records = _records(3, duration=60)
    kill = WorldKill(2, 101, KillReason.SOFT_LIMIT_PRESSURE, "4096 B over", 5_000.0)
    result = _step(
        [[True] * 3, [True] * 3], finished=((0, 101),), failed=((1, "no such model"),), kills=(kill,)
    )
    endings = task_endings(records, result, last_second=99)
    assert [e.event for e in endings] == [TaskEvent.FINISHED, TaskEvent.FAILED, TaskEvent.OOM]
    finished, failed, killed = endings
    assert (finished.row, finished.at_ms, finished.exit_code) == (0, 101_000, 0)
    assert finished.detail == "ran its 60 s"
    assert finished.cause_id == f"finish:{records[0].plan.name}"
    assert (failed.row, failed.detail, failed.at_ms) == (
        1,
        "no such model",
        100_000,
    )  # the step's first second
    assert (killed.row, killed.exit_code, killed.memory_bytes, killed.at_ms) == (
        2,
        KILL_EXIT_CODE,
        5000,
        101_000,
    )
    assert killed.detail.startswith("OOM: over soft memory limit under machine memory pressure: 4096 B over")
    assert killed.cause_id == f"oom:m1:{records[2].plan.name}:101"


def test_a_failure_in_a_step_of_no_seconds_is_dated_at_the_last_second() -> None:
    result = _step(
        [[True]], sampled=np.zeros((0, 1), bool), seconds=np.zeros(0, np.int64), failed=((0, "bad"),)
    )
    (ending,) = task_endings(_records(1), result, last_second=42)
    assert ending.at_ms == 42_000
