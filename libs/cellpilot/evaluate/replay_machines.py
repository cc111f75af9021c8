"""The machines of the closed-loop replay: where the replayed tasks run, and who is OOM-killed.

Soft RAM limits are only enforced while a machine is short of memory (Autopilot §2.3), so
whether a soft limit costs an OOM depends on the tasks it shares a machine with. The replay
places its own tasks on machines and judges every window with the Borglet's enforcement
(:func:`cellpilot.world.enforcement.enforce_limits`), fed the co-located replayed tasks:

* **Placement.** Consecutive jobs form *pools* of ``pool_jobs`` jobs; a pool's tasks share
  ``ceil(requests / (overcommit x machine size))`` machines, each task on the machine with
  the least requested memory so far (the scheduler spreads a job's tasks, Borg §3.2). A
  task's request is the largest manual limit its owner set, so the limits placed on a
  machine add up to ``overcommit`` times its memory. The placement is computed once, before
  any decider runs, so every compared decider sees the same machines (the comparison stays
  paired), and a pool is always replayed whole, so results do not depend on how pools are
  grouped into shards.
* **A full, overcommitted cell** (Borg §5.5, resource reclamation). A task's *reservation*
  is its limit in force divided by ``overcommit`` (what is left of the limit once the
  Borgmaster has reclaimed the unused part); a task without a limit reserves what it uses.
  The memory the replayed tasks do not reserve, less ``free_fraction`` of the machine that
  nobody reserves, is used by other work in reclaimed resources up to its own reservation
  (the scheduler fills what lower limits free, Autopilot §5). A machine *actually runs out of
  memory* when everything on it, the replayed tasks' usage and that other work, exceeds its
  physical memory, i.e. when the replayed tasks use more than they reserve plus the free
  memory. The Borglet then kills in Borg §5.5's order: tasks over their limits first,
  whatever their priority, from lowest priority, largest first; then the other work (the
  lowest priority, it runs in reclaimed resources: "we kill or throttle non-prod tasks");
  then, only if the replayed tasks alone overflow the machine, tasks within their limits
  (Borg §6.2). Killing stops once the shortage is covered. A hard limit kills at the limit
  whatever the machine (Autopilot §2.3).
* With ``overcommit`` 1 (the cell ``none``) a reservation is the whole limit: the neighbours'
  unused limits absorb every overage they can cover, and nothing within its limit is ever
  killed. A machine whose replayed tasks reserve more than its memory (limits raised in
  place; the replay never moves a task) is taken to be that large.
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

# Borg §5.5: "About 20% of the workload ... runs in reclaimed resources in a median cell":
# reservations are 80 % of limits, so the limits on a full machine add up to 1 / 0.8 = 1.25
# times its memory.
BORG_OVERCOMMIT = 1.25
# A stress setting, not a paper figure: a third of every limit reclaimed (Borg §5.5's
# "aggressive" resource estimation goes further than the median cell, by an unstated amount).
TIGHT_OVERCOMMIT = 1.5


@dataclass(frozen=True)
class CellModel:
    """How the replayed tasks share machines (see the module docstring)."""

    pool_jobs: int = 16  # consecutive jobs whose tasks share a group of machines
    free_fraction: float = 0.0  # of each machine's memory, reserved by no task
    overcommit: float = BORG_OVERCOMMIT  # sum of limits placed on a machine / its memory

    def __post_init__(self) -> None:
        if self.pool_jobs < 1:
            raise ValueError(f"pool_jobs must be >= 1, got {self.pool_jobs}")
        if not 0.0 <= self.free_fraction <= 1.0:
            raise ValueError(f"free_fraction must be in [0, 1], got {self.free_fraction}")
        if not 1.0 <= self.overcommit <= 10.0:
            raise ValueError(f"overcommit must be in [1, 10], got {self.overcommit}")


# The named cells of the CLI and the configuration: ``none`` is the reservation-free model
# (every limit reserved in full), ``borg`` the median cell of Borg §5.5 (the default).
CELL_MODELS: dict[str, CellModel] = {
    "none": CellModel(overcommit=1.0),
    "borg": CellModel(overcommit=BORG_OVERCOMMIT),
    "tight": CellModel(overcommit=TIGHT_OVERCOMMIT),
}
DEFAULT_CELL = "borg"


def pools_of(jobs: int, pool_jobs: int) -> IntpArray:
    """The pool of each of ``jobs`` consecutive jobs (the first job starts a pool)."""
    return np.arange(jobs, dtype=np.intp) // pool_jobs


def place_tasks(requests: FloatArray, pool_of_task: IntpArray, machine_bytes: float) -> tuple[IntpArray, int]:
    """Each task's machine (numbered across pools) and the number of machines.

    ``machine_bytes`` is the requested memory one machine takes (its memory times the
    overcommit). Per pool, ``ceil(sum of requests / machine_bytes)`` machines (at least one); tasks in
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


# The other work in reclaimed resources ranks below every replayed task (Borg §5.5).
_RECLAIMED_PRIORITY = np.iinfo(np.int64).min


@dataclass(frozen=True)
class ReplayMachines:
    """The chunk's placement: every task's machine and priority; each machine's memory, the
    part nobody reserves, and the overcommit that turns limits into reservations."""

    machine: IntpArray  # (N,)
    count: int
    priority: npt.NDArray[np.int64]  # (N,)
    free_bytes: float
    memory_bytes: float = 0.0  # physical memory of a machine (0: as large as its reservations)
    overcommit: float = 1.0

    def _reserved(
        self, running: BoolArray, usage: FloatArray, limit: FloatArray
    ) -> tuple[FloatArray, FloatArray]:
        """(limit in force, 0 = none; per machine, what the replayed tasks reserve)."""
        lim = np.where(running & np.isfinite(limit), limit, 0.0)
        use = np.where(running, usage, 0.0)
        reserved = np.where(lim > 0, lim / self.overcommit, use)
        return lim, np.bincount(self.machine, weights=reserved, minlength=self.count).astype(np.float64)

    def short(self, running: BoolArray, usage: FloatArray, limit: FloatArray) -> BoolArray:
        """Per machine: do the replayed tasks use more than they reserve plus the free memory
        (the machine runs out unless someone is killed)?"""
        _, reserved = self._reserved(running, usage, limit)
        used = np.bincount(self.machine, weights=np.where(running, usage, 0.0), minlength=self.count)
        return np.asarray(used > reserved + self.free_bytes, dtype=bool)

    def memory_kills(self, running: BoolArray, usage: FloatArray, limit: FloatArray, hard: bool) -> BoolArray:
        """Which running tasks are OOM-killed this window (Borglet enforcement, co-located tasks).

        ``limit`` NaN or 0 means no limit: such a task reserves what it uses.
        """
        lim, reserved = self._reserved(running, usage, limit)
        use = np.where(running, usage, 0.0)
        over = running & (lim > 0) & (use > lim)
        used = np.bincount(self.machine, weights=use, minlength=self.count)
        # Only machines with a task over a hard limit or short of memory can kill anything.
        judged = used > reserved + self.free_bytes
        if hard:
            judged[self.machine[over]] = True
        tasks = np.flatnonzero(judged[self.machine] & running)
        if tasks.size == 0:
            return np.zeros_like(over)
        machines, local = np.unique(self.machine[tasks], return_inverse=True)
        # Each judged machine's other work (one pseudo-task, after the replayed ones): what the
        # replayed tasks and the free memory leave of the machine, the machine at least as large
        # as what they reserve.
        capacity = np.maximum(self.memory_bytes, reserved[machines] + self.free_bytes)
        other = capacity - self.free_bytes - reserved[machines]
        n, k = tasks.size, machines.size
        decision = enforce_limits(
            TaskUsage(
                machine=np.concatenate((local, np.arange(k))).astype(np.intp),
                priority=np.concatenate((self.priority[tasks], np.full(k, _RECLAIMED_PRIORITY))),
                cpu_millicores=np.zeros(n + k),
                memory_bytes=np.concatenate((use[tasks], other)),
                cpu_limit_millicores=np.zeros(n + k),
                memory_limit_bytes=np.concatenate((lim[tasks], np.zeros(k))),
                hard_memory_limit=np.concatenate((np.full(n, hard), np.zeros(k, dtype=bool))),
            ),
            MachineCapacity(memory_bytes=capacity),
            now_ms=0,
        )
        killed = np.zeros_like(over)
        killed[tasks] = decision.kill_reason[:n] != KillReason.NONE
        return killed
