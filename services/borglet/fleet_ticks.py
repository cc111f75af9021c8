"""One step of event time for every running task of every hosted machine, as array maths.

The Borglet samples each task once per event-second (Autopilot §3.2.1: r_i[τ], about one
sample a second) and enforces limits on every sample. A fleet-mode Borglet does this for
thousands of tasks, several event-seconds per wall second when sped up, so the work is one
vectorised call per batch of seconds: simulated tasks' usage from their usage models
(:mod:`cellpilot.workloads.usage_models`), process tasks' usage from their latest metering,
then :func:`cellpilot.borg.enforcement.enforce_limits` over all machines at once, second by
second (a task killed at second s is gone from s + 1).

No I/O and no mutation of Borglet state: it runs off the event loop on a snapshot (the
:class:`TaskTable`) and the caller applies the :class:`TickResult`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cellpilot.borg.enforcement import KillReason, MachineMemory, TaskUsage, enforce_limits
from cellpilot.workloads.usage_models import evaluate_usage

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
IndexArray = npt.NDArray[np.intp]


@dataclass(frozen=True)
class SimulatedGroup:
    """Simulated tasks sharing a usage model and parameters (usually one job's tasks)."""

    model: str
    params: Mapping[str, float]
    rows: IndexArray
    keys: IntArray  # seed + task index per task (the model's random key), as int64 bits


@dataclass(frozen=True)
class TaskTable:
    """The running tasks of all hosted machines, struct-of-arrays, sorted by machine."""

    machine: IndexArray
    priority: IntArray
    cpu_limit: FloatArray  # 0 = none
    memory_limit: FloatArray  # 0 = none
    hard_memory_limit: BoolArray
    simulated: BoolArray
    start_s: FloatArray  # event time the task started, seconds
    duration_s: FloatArray  # simulated tasks finish after this long; 0 = never
    groups: tuple[SimulatedGroup, ...]
    memory_capacity: FloatArray  # per machine
    pressure_fraction: float
    # Rows of machine i are machine_bounds[i] .. machine_bounds[i + 1] - 1.
    machine_bounds: IndexArray

    @property
    def size(self) -> int:
        return int(self.machine.shape[0])

    @staticmethod
    def bounds(machine: IndexArray, machines: int) -> IndexArray:
        return np.searchsorted(machine, np.arange(machines + 1), side="left").astype(np.intp)


@dataclass(frozen=True)
class ProcessUsage:
    """Latest metering of process tasks (zeros on simulated rows)."""

    cpu: FloatArray
    memory: FloatArray
    throttled: BoolArray  # the kernel throttled it (cgroup cpu.stat) since the last metering


@dataclass(frozen=True)
class TickKill:
    row: int
    second: int
    reason: KillReason
    detail: str
    memory_bytes: float


@dataclass(frozen=True)
class TickResult:
    seconds: IntArray  # (k,) event seconds processed
    cpu: FloatArray  # (k, n) CPU reported: simulated throttled to the limit, process as metered
    memory: IntArray  # (k, n)
    throttled: BoolArray  # (k, n)
    sampled: BoolArray  # (k, n) the task ran at that second (a sample is due)
    finished: tuple[tuple[int, int], ...]  # (row, second) simulated tasks that ran their duration
    kills: tuple[TickKill, ...]
    memory_pressure: BoolArray  # (machines,) at the last second
    memory_used: FloatArray  # (machines,) at the last second, after kills


def empty_usage(n: int) -> ProcessUsage:
    return ProcessUsage(np.zeros(n), np.zeros(n), np.zeros(n, dtype=bool))


def run_ticks(table: TaskTable, seconds: IntArray, process: ProcessUsage) -> TickResult:
    """Sample and enforce for each event-second in ``seconds`` (ascending)."""
    k, n = int(seconds.shape[0]), table.size
    machines = int(table.memory_capacity.shape[0])
    cpu = np.zeros((k, n))
    memory = np.zeros((k, n))
    t = seconds.astype(np.float64)[:, None]
    for group in table.groups:
        c, m = evaluate_usage(group.model, group.params, 0, group.keys, t, table.start_s[group.rows])
        cpu[:, group.rows] = c
        memory[:, group.rows] = m
    is_process = ~table.simulated
    cpu[:, is_process] = process.cpu[is_process]
    memory[:, is_process] = process.memory[is_process]

    reported = cpu.copy()
    throttled = np.zeros((k, n), dtype=bool)
    throttled[:, is_process] = process.throttled[is_process]
    sampled = np.zeros((k, n), dtype=bool)
    alive = np.ones(n, dtype=bool)
    finished: list[tuple[int, int]] = []
    kills: list[TickKill] = []
    capacity = MachineMemory(table.memory_capacity, table.pressure_fraction)
    pressure = np.zeros(machines, dtype=bool)
    used = np.zeros(machines)

    for j, second in enumerate(seconds.tolist()):
        age = second - table.start_s
        done = alive & table.simulated & (table.duration_s > 0) & (age >= table.duration_s)
        for row in np.flatnonzero(done).tolist():
            finished.append((row, second))
        alive &= ~done
        rows = np.flatnonzero(alive & (age >= 0))
        decision = enforce_limits(
            TaskUsage(
                machine=table.machine[rows],
                priority=table.priority[rows],
                cpu_millicores=cpu[j, rows],
                memory_bytes=memory[j, rows],
                cpu_limit_millicores=table.cpu_limit[rows],
                memory_limit_bytes=table.memory_limit[rows],
                hard_memory_limit=table.hard_memory_limit[rows],
            ),
            capacity,
            now_ms=second * 1000,
        )
        simulated_rows = table.simulated[rows]
        # A simulated task is throttled to its limit by the (simulated) kernel; a process
        # task reports what it really used, and is recorded as throttled when above it.
        reported[j, rows] = np.where(simulated_rows, decision.cpu_granted_millicores, cpu[j, rows])
        throttled[j, rows] |= decision.cpu_throttled
        sampled[j, rows] = True
        for kill in decision.kills:
            row = int(rows[kill.task])
            alive[row] = False
            kills.append(TickKill(row, second, kill.reason, kill.detail, kill.memory_bytes))
        pressure = decision.memory_pressure
        used = decision.memory_after_bytes

    return TickResult(
        seconds=seconds.astype(np.int64),
        cpu=reported,
        memory=np.rint(memory).astype(np.int64),
        throttled=throttled,
        sampled=sampled,
        finished=tuple(finished),
        kills=tuple(kills),
        memory_pressure=np.asarray(pressure, dtype=bool),
        memory_used=np.asarray(used, dtype=np.float64),
    )
