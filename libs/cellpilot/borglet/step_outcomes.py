"""What one step of event time means for each running task: its latest usage and how it ended.

:func:`cellpilot.borglet.fleet_ticks.run_ticks` steps the world for a batch of event-seconds;
this module reads its :class:`~cellpilot.world.step.WorldStep` back in the Borglet's terms.
:func:`latest_usage` gives each sampled task's usage at its last sampled second (what the
next poll reports, Borg §3.3); :func:`task_endings` gives the tasks that ended in the step —
a simulated task that ran its duration, a task whose usage could not be evaluated, and every
memory kill with the reason the enforcement gave (Autopilot §2.3: a task over its hard limit,
one over its soft limit while the machine is short, any task when the machine runs out) —
in the order the Borglet applies them. The service applies them; a task already ended by an
earlier entry of the same step is skipped there. :func:`process_exit` says the same of a
process that exited: the event it means for the task's lifecycle.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cellpilot.borg.lifecycle import TaskEvent
from cellpilot.borglet.hosted_task import HostedTask, SimulatedPlan
from cellpilot.borglet.task_lifecycle import PhaseEvent
from cellpilot.world.enforcement import KillReason
from cellpilot.world.step import WorldStep

KILL_EXIT_CODE = -int(signal.SIGKILL)

KILL_REASON_TEXT: dict[KillReason, str] = {
    KillReason.HARD_LIMIT: "OOM: hard memory limit exceeded",
    KillReason.SOFT_LIMIT_PRESSURE: "OOM: over soft memory limit under machine memory pressure",
    KillReason.MACHINE_OUT_OF_MEMORY: "OOM: machine out of memory",
}


@dataclass(frozen=True)
class LatestUsage:
    """A task's usage at the last second it was sampled in the step."""

    row: int
    cpu_millicores: float
    memory_bytes: int
    cpu_throttled: bool
    cpu_unmet_millicores: float


@dataclass(frozen=True)
class TaskEnding:
    """A task the step ended: FINISHED (exit 0), FAILED, or OOM (killed, exit -SIGKILL)."""

    row: int
    event: TaskEvent
    detail: str
    cause_id: str
    at_ms: int
    exit_code: int = 0
    memory_bytes: int | None = None  # at the kill, for OOM


def latest_usage(result: WorldStep) -> list[LatestUsage]:
    """One entry per task sampled at least once in the step, at its last sampled second."""
    sampled = result.sampled
    if not sampled.shape[0]:
        return []
    any_sampled = sampled.any(axis=0)
    last = sampled.shape[0] - 1 - np.argmax(sampled[::-1], axis=0)
    rows = np.flatnonzero(any_sampled)
    at = last[rows]
    return [
        LatestUsage(int(row), float(cpu), int(memory), bool(throttled), float(unmet))
        for row, cpu, memory, throttled, unmet in zip(
            rows.tolist(),
            result.cpu[at, rows].tolist(),
            result.memory[at, rows].tolist(),
            result.throttled[at, rows].tolist(),
            result.cpu_unmet[at, rows].tolist(),
            strict=True,
        )
    ]


def task_endings(rows: Sequence[HostedTask], result: WorldStep, last_second: int) -> list[TaskEnding]:
    """The tasks ``result`` ended, in the order they are applied: finished, failed, killed.

    ``rows`` are the table's task records (row i of the step is ``rows[i]``); ``last_second`` is
    the second a failure is dated at when the step processed no second.
    """
    endings: list[TaskEnding] = []
    for row, second in result.finished:
        runtime = rows[row].plan.runtime
        assert isinstance(runtime, SimulatedPlan)
        name = rows[row].plan.name
        endings.append(
            TaskEnding(
                row,
                TaskEvent.FINISHED,
                f"ran its {runtime.duration_seconds} s",
                f"finish:{name}",
                second * 1000,
            )
        )
    failed_at = int(result.seconds[0]) if result.seconds.size else last_second
    for row, reason in result.failed:
        cause = f"usage:{rows[row].plan.name}:{failed_at}"
        endings.append(TaskEnding(row, TaskEvent.FAILED, reason, cause, failed_at * 1000))
    for kill in result.kills:
        record = rows[kill.row]
        endings.append(
            TaskEnding(
                kill.row,
                TaskEvent.OOM,
                f"{KILL_REASON_TEXT[kill.reason]}: {kill.detail}",
                f"oom:{record.machine_id}:{record.plan.name}:{kill.second}",
                kill.second * 1000,
                KILL_EXIT_CODE,
                int(kill.memory_bytes),
            )
        )
    return endings


def process_exit(
    task: HostedTask, exit_code: int, oom_kills: int, memory_peak: int, now_ms: int
) -> PhaseEvent:
    """The EXITED event of a task's process: as its stop says when it was stopped (at the time of
    the stop), else an OOM kill when the kernel killed it in its cgroup (``oom_kills``, the
    cgroup's memory.events count, and ``memory_peak`` in bytes), else FINISHED on exit code 0 and
    FAILED otherwise."""
    name = task.plan.name
    if task.stop_kind is not None:
        at_ms = task.stop_ms if task.stop_ms is not None else now_ms
        return PhaseEvent.exited(task.stop_kind, exit_code, task.stop_detail, task.stop_cause, at_ms)
    if exit_code != 0 and oom_kills > 0:
        memory = max(task.memory_bytes, memory_peak)  # the memory at the kill
        detail = _kernel_oom_detail(task, oom_kills, memory_peak)
        cause = f"oom:{task.machine_id}:{name}:kernel"
        return PhaseEvent.exited(TaskEvent.OOM, exit_code, detail, cause, now_ms, memory)
    if exit_code == 0:
        return PhaseEvent.exited(TaskEvent.FINISHED, 0, "exit code 0", f"exit:{name}", now_ms)
    return PhaseEvent.exited(TaskEvent.FAILED, exit_code, f"exit code {exit_code}", f"exit:{name}", now_ms)


def _kernel_oom_detail(task: HostedTask, oom_kills: int, memory_peak: int) -> str:
    """The kernel OOM-killed the task in its cgroup (Borg §6.2: the Borglet "handles
    Out-of-Memory (OOM) events from the kernel"); say at which limit, with the kill count."""
    limit = task.plan.limits.memory_bytes
    counted = f"cgroup memory.events oom_kill {oom_kills}"
    if task.plan.hard_memory_limit and limit > 0:
        return (
            f"{KILL_REASON_TEXT[KillReason.HARD_LIMIT]}: killed by the kernel at memory.max {limit} B "
            f"(peak {memory_peak} B; {counted})"
        )
    reason = KILL_REASON_TEXT[KillReason.MACHINE_OUT_OF_MEMORY]
    return f"{reason}: killed by the kernel's OOM killer ({counted})"
