"""The machines of the closed-loop replay: where the replayed tasks run, and who is OOM-killed.

Soft RAM limits are only enforced while a machine is short of memory (Autopilot §2.3), so
whether a soft limit costs an OOM depends on the tasks it shares a machine with. The replay
places its own tasks on machines and judges every window with the Borglet's enforcement
(:func:`cellpilot.world.enforcement.enforce_limits`), fed the co-located replayed tasks:

* **Placement.** Consecutive jobs form *pools* of ``pool_jobs`` jobs; a pool's tasks share
  ``ceil(requests / machine size)`` machines, each task on the machine with the least
  requested memory so far (the scheduler spreads a job's tasks, Borg §3.2). A task's request
  is the largest manual limit its owner set. The placement is computed once, before any
  decider runs, so every compared decider sees the same machines (the comparison stays
  paired), and a pool is always replayed whole, so results do not depend on how pools are
  grouped into shards.
* **A full cell.** The memory a machine's tasks do not reserve is used by other work up to
  its own reservation (the scheduler fills what lower limits free, Autopilot §5; batch runs
  in reclaimed resources, Borg §5.5). A machine's capacity for the replayed tasks is
  therefore the sum of their limits in force, plus ``free_fraction`` of a machine nobody has
  reserved. A machine runs short when its tasks together use more than that: a task over its
  soft limit is then killed only if its co-located tasks' unused limits do not cover it.
  Borg §5.5's order applies: tasks over their limits first, from lowest priority, largest
  first, until the shortage is covered.
* Usage is the window's peak of every task, as if the co-located peaks coincided (the
  pessimistic reading of 5-minute data; the replay has no finer time).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cellpilot.array_types import BoolArray, FloatArray, IntpArray
from cellpilot.world.enforcement import KillReason, MachineCapacity, TaskUsage, enforce_limits


@dataclass(frozen=True)
class CellModel:
    """How the replayed tasks share machines (see the module docstring)."""

    pool_jobs: int = 16  # consecutive jobs whose tasks share a group of machines
    free_fraction: float = 0.0  # of each machine's memory, reserved by no task

    def __post_init__(self) -> None:
        if self.pool_jobs < 1:
            raise ValueError(f"pool_jobs must be >= 1, got {self.pool_jobs}")
        if not 0.0 <= self.free_fraction <= 1.0:
            raise ValueError(f"free_fraction must be in [0, 1], got {self.free_fraction}")


def pools_of(jobs: int, pool_jobs: int) -> IntpArray:
    """The pool of each of ``jobs`` consecutive jobs (the first job starts a pool)."""
    return np.arange(jobs, dtype=np.intp) // pool_jobs


def place_tasks(requests: FloatArray, pool_of_task: IntpArray, machine_bytes: float) -> tuple[IntpArray, int]:
    """Each task's machine (numbered across pools) and the number of machines.

    Per pool, ``ceil(sum of requests / machine_bytes)`` machines (at least one); tasks in
    order, each on the machine with the least requested memory so far (ties: lowest number).
    """
    if machine_bytes <= 0:
        raise ValueError("machine_bytes must be > 0")
    requests = np.nan_to_num(np.asarray(requests, dtype=np.float64), nan=0.0)
    machine = np.empty(requests.shape[0], dtype=np.intp)
    first = 0
    for pool in np.unique(pool_of_task):
        members = np.flatnonzero(pool_of_task == pool)
        count = max(1, math.ceil(float(requests[members].sum()) / machine_bytes))
        load = np.zeros(count)
        for i in members:
            m = int(np.argmin(load))
            machine[i] = first + m
            load[m] += requests[i]
        first += count
    return machine, first


@dataclass(frozen=True)
class ReplayMachines:
    """The chunk's placement: every task's machine, its priority, each machine's free memory."""

    machine: IntpArray  # (N,)
    count: int
    priority: npt.NDArray[np.int64]  # (N,)
    free_bytes: float

    def memory_kills(self, running: BoolArray, usage: FloatArray, limit: FloatArray, hard: bool) -> BoolArray:
        """Which running tasks are OOM-killed this window (Borglet enforcement, co-located tasks).

        ``limit`` NaN or 0 means no limit: such a task reserves what it uses.
        """
        lim = np.where(running & np.isfinite(limit), limit, 0.0)
        use = np.where(running, usage, 0.0)
        over = running & (lim > 0) & (use > lim)
        if not over.any():
            return over
        reserved = np.where(lim > 0, lim, use)
        capacity = np.bincount(self.machine, weights=reserved, minlength=self.count).astype(np.float64)
        capacity += self.free_bytes
        used = np.bincount(self.machine, weights=use, minlength=self.count)
        # Only machines with a task over a hard limit or short of memory can kill anything.
        judged = np.zeros(self.count, dtype=bool)
        judged[self.machine[over]] = True
        if not hard:
            judged &= used > capacity
        tasks = np.flatnonzero(judged[self.machine] & running)
        if tasks.size == 0:
            return np.zeros_like(over)
        machines, local = np.unique(self.machine[tasks], return_inverse=True)
        n = tasks.size
        decision = enforce_limits(
            TaskUsage(
                machine=local.astype(np.intp),
                priority=self.priority[tasks],
                cpu_millicores=np.zeros(n),
                memory_bytes=use[tasks],
                cpu_limit_millicores=np.zeros(n),
                memory_limit_bytes=lim[tasks],
                hard_memory_limit=np.full(n, hard),
            ),
            MachineCapacity(memory_bytes=capacity[machines]),
            now_ms=0,
        )
        killed = np.zeros_like(over)
        killed[tasks] = decision.kill_reason != KillReason.NONE
        return killed
