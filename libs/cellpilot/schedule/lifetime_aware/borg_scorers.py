"""LAS and LAVA as scorers of the Borg scheduling core (:mod:`cellpilot.schedule.plugins`).

§4.2 adds LAS to Borg's lexicographic scoring one level above bin packing; §4.3 adds
LAVA's preference one level above LAS. Here both fit the core's :class:`Scorer`
protocol (scores on 0-100, higher is better) so a profile can stack them::

    lifetimes = CellLifetimes(cell)
    scoring = Lexicographic((Level(LavaScorer(lifetimes)), Level(LasScorer(lifetimes)), Level(BestFit())))

The caller keeps :class:`CellLifetimes` in step with the cell: ``expect`` a job's
predicted remaining lifetime before scheduling it, then ``started`` / ``ended`` /
``repredicted`` as tasks come and go, and ``advance`` the clock (LAVA's deadlines).
Scores map the discrete costs linearly: temporal cost c -> 100 (1 - c / 10); LAVA
rank r -> 100 (1 - r / RANK_EMPTY); a job with no prediction scores 100 everywhere,
so the level never decides for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cellpilot.schedule.cell import LIMIT, NUM_LEVELS, Cell
from cellpilot.schedule.lifetime_aware.lava import RANK_EMPTY, LavaHosts
from cellpilot.schedule.lifetime_aware.lifetime_scores import MAX_TEMPORAL_COST, lifetime_class, temporal_cost
from cellpilot.schedule.lifetime_aware.policies import VmRequest
from cellpilot.schedule.plugins import MAX_SCORE, FloatArray, IntArray, Request


class _CellPool:
    """A read view of a cell in the shape LAVA's state machine reads (CPU and RAM come first)."""

    def __init__(self, cell: Cell) -> None:
        self.cell = cell

    @property
    def n(self) -> int:
        return self.cell.n_machines

    @property
    def used(self) -> FloatArray:
        return self.cell.below[: self.n, NUM_LEVELS, LIMIT]

    @property
    def capacity(self) -> FloatArray:
        return self.cell.capacity[: self.n]

    @property
    def vm_count(self) -> IntArray:
        return np.fromiter((len(t) for t in self.cell.machine_tasks), dtype=np.intp, count=self.n)

    @property
    def vms(self) -> Sequence[set[int]]:
        return self.cell.machine_tasks


class CellLifetimes:
    """Predicted exit times of a cell's tasks and LAVA's per-machine state.

    Machines must be in the cell before this is built (LAVA's arrays are sized then).
    """

    def __init__(self, cell: Cell) -> None:
        self.cell = cell
        self.now = 0.0
        self.task_exit: dict[int, float] = {}
        self.job_remaining: dict[int, float] = {}
        self.hosts = LavaHosts(_CellPool(cell))

    def expect(self, job: str, remaining: float) -> None:
        """The predicted remaining lifetime (s) of the tasks of ``job`` about to be scheduled."""
        self.job_remaining[self.cell.job_code(job)] = remaining

    def advance(self, now: float) -> None:
        self.now = now
        self.hosts.advance(now)

    def started(self, handle: int, remaining: float, now: float) -> None:
        """After ``cell.bind`` returned ``handle``."""
        self.task_exit[handle] = now + remaining
        machine = int(self.cell.t_machine[handle])
        self.hosts.placed(machine, VmRequest(handle, np.zeros(0), remaining), now)

    def repredicted(self, handle: int, remaining: float, now: float) -> None:
        self.task_exit[handle] = now + remaining

    def ended(self, handle: int, machine: int, now: float) -> None:
        """After ``cell.unbind(handle)`` removed the task from ``machine``."""
        self.task_exit.pop(handle, None)
        self.hosts.removed(machine, handle, now)

    def machine_exit(self, machines: IntArray) -> FloatArray:
        """Latest predicted exit per machine; ``now`` for machines without tracked tasks."""
        out = np.full(machines.shape[0], self.now)
        tasks = self.cell.machine_tasks
        for i, m in enumerate(machines.tolist()):
            exits = [self.task_exit[h] for h in tasks[m] if h in self.task_exit]
            if exits:
                out[i] = max(self.now, max(exits))
        return out


@dataclass(frozen=True)
class LasScorer:
    """LAS's temporal cost (§4.2) as a Borg scorer."""

    lifetimes: CellLifetimes
    name: str = "las"
    job_dependent: bool = True

    def score(self, cell: Cell, req: Request, machines: IntArray) -> FloatArray:
        remaining = self.lifetimes.job_remaining.get(req.job)
        if remaining is None:
            return np.full(machines.shape[0], MAX_SCORE)
        lt = self.lifetimes
        cost = temporal_cost(lt.now + remaining, lt.machine_exit(machines))
        return MAX_SCORE * (1.0 - cost / MAX_TEMPORAL_COST)


@dataclass(frozen=True)
class LavaScorer:
    """LAVA's host preference (§4.3) as a Borg scorer."""

    lifetimes: CellLifetimes
    name: str = "lava"
    job_dependent: bool = True

    def score(self, cell: Cell, req: Request, machines: IntArray) -> FloatArray:
        remaining = self.lifetimes.job_remaining.get(req.job)
        if remaining is None:
            return np.full(machines.shape[0], MAX_SCORE)
        ranks = self.lifetimes.hosts.ranks(int(lifetime_class(remaining)), machines.astype(np.int64))
        return MAX_SCORE * (1.0 - ranks / RANK_EMPTY)
