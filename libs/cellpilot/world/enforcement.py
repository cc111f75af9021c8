"""Limit enforcement on a machine: OOM kills and CPU throttling, as the Borglet does it.

Pure core (no I/O, ``now`` passed in), vectorised over a machine's tasks — and over many
machines at once, which is how a fleet-mode Borglet hosting a thousand simulated machines
calls it: every task carries the index of its machine.

The rules (Autopilot §2.3, Borg §5.5 and §6.2):

* **Hard RAM limit**: a task over its memory limit is OOM-killed at once, whatever the
  machine's state (Autopilot §2.3).
* **Soft RAM limit**: a task may use more memory than its limit; it is killed only while
  its machine is short of memory (Autopilot §2.3: until the machine is "no longer at risk").
  Tasks over their limit go first regardless of priority (Borg §5.5: such a task "will be
  the first to be preempted"); then, if the machine is still short (it really runs out of a
  non-compressible resource), the other tasks from lowest to highest priority (Borg §6.2).
  Within one priority the task using the most memory goes first, so the shortage is gone
  after as few kills as possible; ties by position, so the result is deterministic.
  Killing stops as soon as the memory freed covers the shortage.
* **CPU** is compressible: throttled, never killed (Borg §6.2). With the machine's CPU
  capacity known, the machine shares it the way Autopilot §2.3 and Borg §6.2 describe: with
  little contention tasks use CPU beyond their limits (spare, "slack" CPU); once there is
  contention limits are enforced, and latency-sensitive (LS) tasks are served before batch
  ones. The capacity is handed out in four tiers, each in full while it fits, else to every
  task of the tier in proportion to what it asks (one CFS-like share each):

  1. LS tasks' demand up to their limits;
  2. batch tasks' demand up to their limits (batch may run in reclaimed resources, Borg
     §5.5, so their limits need not fit: they are throttled below them under contention);
  3. LS tasks' demand above their limits (bursting into spare CPU);
  4. batch tasks' demand above their limits.

  Tasks whose CPU is *measured* (a real process: the kernel has already decided) count at
  what they used, ahead of every tier. Without a capacity, every task is capped at its limit.
  What a task demanded and did not get is its **unmet demand** (throttled CPU, a rate in
  millicores: over one second, the throttled CPU-seconds x 1000), the signal the usage
  samples carry.

A machine is *short of memory* when the memory its tasks use (after the hard-limit kills)
exceeds ``pressure_fraction`` of its capacity; the shortage is the excess. A limit of 0
means "no limit" for that resource.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cellpilot.array_types import BoolArray, FloatArray, Int64Array


class KillReason(enum.IntEnum):
    NONE = 0
    HARD_LIMIT = 1  # over a hard memory limit
    SOFT_LIMIT_PRESSURE = 2  # over a soft memory limit while the machine is short of memory
    MACHINE_OUT_OF_MEMORY = 3  # within its limit, but the machine is still short after the above


@dataclass(frozen=True)
class TaskUsage:
    """The tasks to judge, struct-of-arrays (one entry per task, all arrays the same length)."""

    machine: npt.NDArray[np.intp]  # index of the task's machine in MachineCapacity arrays
    priority: Int64Array
    cpu_millicores: FloatArray  # CPU the task demands (rate)
    memory_bytes: FloatArray  # memory the task uses
    cpu_limit_millicores: FloatArray  # 0 = no limit
    memory_limit_bytes: FloatArray  # 0 = no limit
    hard_memory_limit: BoolArray  # True: hard RAM limit; False: soft
    latency_sensitive: BoolArray | None = None  # Borg §6.2 appclass; None = every task LS
    cpu_measured: BoolArray | None = None  # CPU already used (a process), not granted; None = none

    @classmethod
    def single_machine(
        cls,
        priority: npt.ArrayLike,
        cpu_millicores: npt.ArrayLike,
        memory_bytes: npt.ArrayLike,
        cpu_limit_millicores: npt.ArrayLike,
        memory_limit_bytes: npt.ArrayLike,
        hard_memory_limit: npt.ArrayLike,
        latency_sensitive: npt.ArrayLike = True,
    ) -> TaskUsage:
        """Tasks all on machine 0 (scalars broadcast to the number of tasks)."""
        arrays = np.broadcast_arrays(
            np.asarray(priority, dtype=np.int64),
            np.asarray(cpu_millicores, dtype=np.float64),
            np.asarray(memory_bytes, dtype=np.float64),
            np.asarray(cpu_limit_millicores, dtype=np.float64),
            np.asarray(memory_limit_bytes, dtype=np.float64),
            np.asarray(hard_memory_limit, dtype=np.bool_),
            np.asarray(latency_sensitive, dtype=np.bool_),
        )
        flat = [np.array(a).reshape(-1) for a in arrays]
        return cls(
            machine=np.zeros(flat[0].shape, dtype=np.intp),
            priority=flat[0].astype(np.int64),
            cpu_millicores=flat[1].astype(np.float64),
            memory_bytes=flat[2].astype(np.float64),
            cpu_limit_millicores=flat[3].astype(np.float64),
            memory_limit_bytes=flat[4].astype(np.float64),
            hard_memory_limit=flat[5].astype(np.bool_),
            latency_sensitive=flat[6].astype(np.bool_),
        )

    def __len__(self) -> int:
        return int(self.machine.shape[0])


@dataclass(frozen=True)
class MachineCapacity:
    """Each machine's memory (and how full it may get before it is short) and CPU."""

    memory_bytes: FloatArray
    pressure_fraction: float = 1.0  # short of memory when used > fraction * capacity
    cpu_millicores: FloatArray | None = None  # None: no sharing modelled, CPU capped at limits

    def __post_init__(self) -> None:
        if not 0.0 < self.pressure_fraction <= 1.0:
            raise ValueError(f"pressure_fraction must be in (0, 1], got {self.pressure_fraction}")


@dataclass(frozen=True)
class Kill:
    """One task to kill, with the reason a person can read."""

    task: int  # position in TaskUsage
    reason: KillReason
    detail: str
    memory_bytes: float
    memory_limit_bytes: float


@dataclass(frozen=True)
class EnforcementDecision:
    now_ms: int
    kill_reason: npt.NDArray[np.int8]  # KillReason per task; NONE for tasks left running
    kills: tuple[Kill, ...]  # the killed tasks in the order they are killed
    cpu_granted_millicores: FloatArray  # CPU the task gets (a measured task: what it used)
    cpu_unmet_millicores: FloatArray  # demand not granted (0 for a measured task)
    cpu_throttled: BoolArray  # some demand went unmet
    memory_used_bytes: FloatArray  # per machine, every task counted
    memory_threshold_bytes: FloatArray  # per machine: pressure_fraction * capacity
    memory_pressure: BoolArray  # per machine: short of memory after the hard-limit kills
    memory_after_bytes: FloatArray  # per machine, after all kills

    @property
    def killed(self) -> BoolArray:
        return np.asarray(self.kill_reason != KillReason.NONE)


# Unmet demand below this (millicores) is rounding, not throttling.
_UNMET_EPSILON = 1e-6


def share_cpu(tasks: TaskUsage, machines: MachineCapacity) -> tuple[FloatArray, FloatArray]:
    """(granted, unmet) CPU of every task: the four tiers of the module docstring, per machine."""
    demand = np.maximum(tasks.cpu_millicores, 0.0)
    limit = tasks.cpu_limit_millicores
    within = np.where(limit > 0, np.minimum(demand, limit), demand)
    n = len(tasks)
    measured = np.zeros(n, dtype=bool) if tasks.cpu_measured is None else tasks.cpu_measured
    if machines.cpu_millicores is None:
        granted = np.where(measured, demand, within)
        return granted, np.where(measured, 0.0, demand - within)
    ls = np.ones(n, dtype=bool) if tasks.latency_sensitive is None else tasks.latency_sensitive
    m = int(machines.cpu_millicores.shape[0])
    spare = machines.cpu_millicores.astype(np.float64) - np.bincount(
        tasks.machine, weights=np.where(measured, demand, 0.0), minlength=m
    )
    spare = np.maximum(spare, 0.0)
    granted = np.where(measured, demand, 0.0)
    above = demand - within
    for ask, members in ((within, ls), (within, ~ls), (above, ls), (above, ~ls)):
        request = np.where(members & ~measured, ask, 0.0)
        total = np.bincount(tasks.machine, weights=request, minlength=m)
        with np.errstate(divide="ignore", invalid="ignore"):
            fraction = np.where(total > spare, spare / total, 1.0)
        granted += request * fraction[tasks.machine]
        spare = np.maximum(spare - total, 0.0)
    unmet = np.where(measured, 0.0, np.maximum(demand - granted, 0.0))
    return granted, unmet


def enforce_limits(tasks: TaskUsage, machines: MachineCapacity, now_ms: int) -> EnforcementDecision:
    """Decide which tasks die (and why) and how much CPU each gets, at event time ``now_ms``."""
    n = len(tasks)
    m = int(machines.memory_bytes.shape[0])
    memory = tasks.memory_bytes
    limit = tasks.memory_limit_bytes
    reason = np.zeros(n, dtype=np.int8)

    cpu_granted, cpu_unmet = share_cpu(tasks, machines)

    over = (limit > 0) & (memory > limit)
    hard = over & tasks.hard_memory_limit
    reason[hard] = KillReason.HARD_LIMIT

    used = np.bincount(tasks.machine, weights=memory, minlength=m).astype(np.float64)
    threshold = machines.pressure_fraction * machines.memory_bytes.astype(np.float64)
    after_hard = used - np.bincount(tasks.machine, weights=np.where(hard, memory, 0.0), minlength=m)
    shortage = np.maximum(after_hard - threshold, 0.0)
    pressure = shortage > 0

    # Candidates on short machines, in kill order: machine, over-limit first, priority
    # ascending, memory descending, position. Tasks using no memory would free nothing.
    candidate = ~hard & pressure[tasks.machine] & (memory > 0)
    idx = np.flatnonzero(candidate)
    order = np.lexsort((idx, -memory[idx], tasks.priority[idx], ~over[idx], tasks.machine[idx]))
    queue = idx[order]
    on = tasks.machine[queue]
    freed = memory[queue]
    freed_before = np.cumsum(freed) - freed
    # Restart the running sum at each machine's first candidate.
    first = np.ones(queue.shape[0], dtype=bool)
    first[1:] = on[1:] != on[:-1]
    segment_base = np.maximum.accumulate(np.where(first, freed_before, 0.0)) if queue.size else freed
    kill_queue = queue[(freed_before - segment_base) < shortage[on]]
    reason[kill_queue] = np.where(
        over[kill_queue], KillReason.SOFT_LIMIT_PRESSURE, KillReason.MACHINE_OUT_OF_MEMORY
    )

    after = after_hard - np.bincount(
        tasks.machine[kill_queue], weights=memory[kill_queue], minlength=m
    ).astype(np.float64)
    kills = tuple(
        _kill(int(i), KillReason(int(reason[i])), tasks, threshold)
        for i in (*np.flatnonzero(hard), *kill_queue)
    )
    return EnforcementDecision(
        now_ms=now_ms,
        kill_reason=reason,
        kills=kills,
        cpu_granted_millicores=np.asarray(cpu_granted, dtype=np.float64),
        cpu_unmet_millicores=np.asarray(cpu_unmet, dtype=np.float64),
        cpu_throttled=np.asarray(cpu_unmet > _UNMET_EPSILON),
        memory_used_bytes=used,
        memory_threshold_bytes=threshold,
        memory_pressure=np.asarray(pressure),
        memory_after_bytes=np.asarray(after, dtype=np.float64),
    )


def _kill(i: int, reason: KillReason, tasks: TaskUsage, threshold: FloatArray) -> Kill:
    memory = float(tasks.memory_bytes[i])
    limit = float(tasks.memory_limit_bytes[i])
    if reason is KillReason.HARD_LIMIT:
        detail = f"memory {memory:.0f} B over its hard limit {limit:.0f} B"
    elif reason is KillReason.SOFT_LIMIT_PRESSURE:
        detail = (
            f"memory {memory:.0f} B over its soft limit {limit:.0f} B while the machine is short of "
            f"memory (threshold {threshold[tasks.machine[i]]:.0f} B); priority {int(tasks.priority[i])}"
        )
    else:
        detail = (
            f"machine out of memory (threshold {threshold[tasks.machine[i]]:.0f} B); killed at "
            f"priority {int(tasks.priority[i])} using {memory:.0f} B"
        )
    return Kill(task=i, reason=reason, detail=detail, memory_bytes=memory, memory_limit_bytes=limit)
