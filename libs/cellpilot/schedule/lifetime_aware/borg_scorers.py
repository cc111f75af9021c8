"""The lifetime-aware scorers: LAS, LAVA and LA-Binary as registered scorer plugins.

§4.2 adds LAS to Borg's lexicographic scoring one level above bin packing; §4.3 adds
LAVA's preference one level above LAS; LA-Binary (§2.4, §5.3) is the baseline they are
compared with. Each fits the core's :class:`Scorer` protocol (scores on 0-100, higher is
better) and is registered (``las``, ``lava``, ``la-binary``), so a profile stacks them::

    lifetimes = CellLifetimes(cell)
    scoring = Lexicographic((Level(LavaScorer(lifetimes)), Level(LasScorer(lifetimes)), Level(BestFit())))

Which levels a placement policy stacks is data (:mod:`.policies`); the Borg scheduler and
the LAVA study (:mod:`.pool_placement`) build the same scorers from it, each over its own
source of lifetimes: :class:`CellLifetimes` (a Borg cell; the Borgmaster's
:class:`~cellpilot.borg.lifetime_tracker.LifetimeTracker` wraps it) or the study's pool.
A scorer reads its source only, through :meth:`LifetimeLevel.job_scores`, by the key of
what is being placed (a job code in a cell, a VM row in the study).

The caller keeps :class:`CellLifetimes` in step with the cell: ``expect`` a job's
predicted remaining lifetime before scheduling it, then ``started`` / ``ended`` /
``repredicted`` as tasks come and go, and ``advance`` the clock (LAVA's deadlines).
Scores map the discrete costs linearly: temporal cost c -> 100 (1 - c / 10); LAVA
rank r -> 100 (1 - r / RANK_EMPTY); LA-Binary rank r -> 100 (1 - r / 2); a job with no
prediction scores 100 everywhere, so the level never decides for it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

import numpy as np

from cellpilot.array_types import BoolArray, FloatArray, IntpArray
from cellpilot.lifetimes.lifetime_classes import lifetime_class as lifetime_class_of
from cellpilot.schedule.cell import LIMIT, NUM_LEVELS, Cell
from cellpilot.schedule.lifetime_aware.host_pool import VmRequest
from cellpilot.schedule.lifetime_aware.lava import RANK_EMPTY, LavaHosts
from cellpilot.schedule.lifetime_aware.lifetime_scores import (
    LA_BINARY_CUTOFF,
    LA_BINARY_EMPTY,
    MAX_TEMPORAL_COST,
    la_binary_ranks,
    temporal_cost,
)
from cellpilot.schedule.plugins import MAX_SCORE, Plugin, Request, register


class Reads(enum.Enum):
    """What a lifetime-aware scorer reads from its source; a placement policy needs the union
    of what its levels read (:mod:`.policies`)."""

    PREDICTIONS = "lifetime predictions"  # §3, §4.2: predicted at placement, repredicted at uptime
    FIRST_PREDICTIONS = "first predictions"  # §2.4, §5.3: the one-shot prediction at creation
    HOST_STATES = "LAVA host states"  # §4.3: empty / open / recycling, classes, deadlines


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
    def vm_count(self) -> IntpArray:
        return np.fromiter((len(t) for t in self.cell.machine_tasks), dtype=np.intp, count=self.n)

    @property
    def vms(self) -> Sequence[set[int]]:
        return self.cell.machine_tasks


class LifetimeSource(Protocol):
    """What LAS and LAVA read: predicted remaining lifetimes and LAVA classes of the jobs being
    placed (by job code; VM row in the study), the clock, each machine's latest predicted exit,
    and LAVA's host preference."""

    @property
    def job_remaining(self) -> Mapping[int, float]: ...

    @property
    def job_class(self) -> Mapping[int, int]: ...

    @property
    def now(self) -> float: ...

    def machine_exit(self, machines: IntpArray) -> FloatArray: ...

    def ranks(self, vm_class: int, machines: IntpArray) -> IntpArray: ...


class FirstPredictionSource(Protocol):
    """What LA-Binary reads (§2.4): the one-shot lifetime predicted at creation of what is being
    placed, each machine's latest exit by its occupants' one-shot predictions, the clock, and
    which machines are occupied."""

    @property
    def job_first_lifetime(self) -> Mapping[int, float]: ...

    @property
    def now(self) -> float: ...

    def machine_first_exit(self, machines: IntpArray) -> FloatArray: ...

    def occupied(self, machines: IntpArray) -> BoolArray: ...


# What a cell's source gives (CellLifetimes; the Borgmaster's LifetimeTracker over it): the
# scheduler keeps no one-shot predictions, so policies that read them run in the study only.
CELL_SOURCE_GIVES = frozenset({Reads.PREDICTIONS, Reads.HOST_STATES})


class CellLifetimes:
    """Predicted exit times of a cell's tasks and LAVA's per-machine state.

    Machines must be in the cell before this is built (LAVA's arrays are sized then).
    """

    def __init__(self, cell: Cell) -> None:
        self.cell = cell
        self.now = 0.0
        self.task_exit: dict[int, float] = {}
        self.job_remaining: dict[int, float] = {}
        self.job_class: dict[int, int] = {}  # LAVA's class when the predictor gives one (§4.3)
        self.hosts = LavaHosts(_CellPool(cell))
        # Latest tracked exit per machine (-inf: none), recomputed for machines marked stale.
        self._machine_exit = np.full(cell.n_machines, -np.inf)
        self._stale: set[int] = set()

    def expect(self, job: str, remaining: float, lifetime_class: int = -1) -> None:
        """The predicted remaining lifetime (s) and LAVA class (-1: the class of ``remaining``)
        of the tasks of ``job`` about to be scheduled."""
        code = self.cell.job_code(job)
        self.job_remaining[code] = remaining
        self.job_class[code] = lifetime_class if lifetime_class >= 0 else int(lifetime_class_of(remaining))

    def forget_pending(self) -> None:
        self.job_remaining.clear()
        self.job_class.clear()

    def advance(self, now: float) -> None:
        self.now = now
        self.hosts.advance(now)

    def started(self, handle: int, remaining: float, now: float, lifetime_class: int = -1) -> None:
        """After ``cell.bind`` returned ``handle``; ``lifetime_class`` -1: the class of ``remaining``."""
        machine = int(self.cell.t_machine[handle])
        self.set_exit(handle, machine, now + remaining)
        self.hosts.placed(machine, VmRequest(handle, np.zeros(0), remaining, lifetime_class), now)

    def set_exit(self, handle: int, machine: int, exit_time: float) -> None:
        """The predicted exit time of a task running on ``machine`` (no LAVA state change)."""
        self.task_exit[handle] = exit_time
        self._stale.add(machine)

    def repredicted(self, handle: int, remaining: float, now: float) -> None:
        self.set_exit(handle, int(self.cell.t_machine[handle]), now + remaining)

    def ended(self, handle: int, machine: int, now: float) -> None:
        """After ``cell.unbind(handle)`` removed the task from ``machine``."""
        self.task_exit.pop(handle, None)
        self._stale.add(machine)
        self.hosts.removed(machine, handle, now)

    def ranks(self, vm_class: int, machines: IntpArray) -> IntpArray:
        """LAVA's preference (§4.3) for a task of ``vm_class``; machines added to the cell after
        this was built rank as empty hosts."""
        out = np.full(machines.shape[0], RANK_EMPTY, dtype=np.int64)
        known = machines < self.hosts.state.shape[0]
        out[known] = self.hosts.ranks(vm_class, machines[known].astype(np.int64))
        return out

    def machine_exit(self, machines: IntpArray) -> FloatArray:
        """Latest predicted exit per machine; ``now`` for machines without tracked tasks."""
        if self._machine_exit.shape[0] < self.cell.n_machines:
            grown = np.full(self.cell.n_machines, -np.inf)
            grown[: self._machine_exit.shape[0]] = self._machine_exit
            self._machine_exit = grown
        tasks = self.cell.machine_tasks
        for m in self._stale:
            exits = [self.task_exit[h] for h in tasks[m] if h in self.task_exit]
            self._machine_exit[m] = max(exits) if exits else -np.inf
        self._stale.clear()
        return np.maximum(self._machine_exit[machines], self.now)


class LifetimeLevel(Plugin):
    """Base of the lifetime-aware scorers: 100 (1 - cost) with a cost in [0, 1] from the
    prediction of what is being placed; no prediction scores 100 everywhere, so the level never
    decides for it. Subclasses are frozen dataclasses with a ``lifetimes`` source field."""

    job_dependent: ClassVar[bool] = True
    reads: ClassVar[frozenset[Reads]] = frozenset()

    def __post_init__(self) -> None:
        if getattr(self, "lifetimes", None) is None:
            raise ValueError(f"scorer {self.name!r} needs a source of lifetime predictions ('lifetimes')")

    def score(self, cell: Cell, req: Request, machines: IntpArray) -> FloatArray:
        return self.job_scores(req.job, machines)

    def job_scores(self, job: int, machines: IntpArray) -> FloatArray:
        """Scores of ``machines`` for what the source knows as ``job`` (a job code, a VM row)."""
        prediction = self.prediction(job)
        if prediction is None:
            return np.full(machines.shape[0], MAX_SCORE)
        return MAX_SCORE * (1.0 - self.cost(prediction, machines))

    def prediction(self, job: int) -> float | None:
        raise NotImplementedError

    def cost(self, prediction: float, machines: IntpArray) -> FloatArray:
        raise NotImplementedError


@register("scorer", "las")
@dataclass(frozen=True)
class LasScorer(LifetimeLevel):
    """LAS's temporal cost (§4.2); the prediction is the job's remaining lifetime."""

    reads: ClassVar[frozenset[Reads]] = frozenset({Reads.PREDICTIONS})
    lifetimes: LifetimeSource | None = None

    def prediction(self, job: int) -> float | None:
        assert self.lifetimes is not None
        return self.lifetimes.job_remaining.get(job)

    def cost(self, prediction: float, machines: IntpArray) -> FloatArray:
        lt = self.lifetimes
        assert lt is not None
        return temporal_cost(lt.now + prediction, lt.machine_exit(machines)) / MAX_TEMPORAL_COST


@register("scorer", "lava")
@dataclass(frozen=True)
class LavaScorer(LifetimeLevel):
    """LAVA's host preference (§4.3); the prediction is the job's lifetime class."""

    reads: ClassVar[frozenset[Reads]] = frozenset({Reads.PREDICTIONS, Reads.HOST_STATES})
    lifetimes: LifetimeSource | None = None

    def prediction(self, job: int) -> float | None:
        assert self.lifetimes is not None
        return self.lifetimes.job_class.get(job)

    def cost(self, prediction: float, machines: IntpArray) -> FloatArray:
        assert self.lifetimes is not None
        return self.lifetimes.ranks(int(prediction), machines) / RANK_EMPTY


@register("scorer", "la-binary")
@dataclass(frozen=True)
class LaBinaryScorer(LifetimeLevel):
    """LA-Binary's preference (§2.4, §5.3): short or long by one-shot predictions, split at
    ``cutoff`` seconds; the prediction is the lifetime predicted at creation."""

    reads: ClassVar[frozenset[Reads]] = frozenset({Reads.FIRST_PREDICTIONS})
    lifetimes: FirstPredictionSource | None = None
    cutoff: float = LA_BINARY_CUTOFF

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.cutoff <= 0:
            raise ValueError("la-binary cutoff must be > 0 seconds")

    def prediction(self, job: int) -> float | None:
        assert self.lifetimes is not None
        return self.lifetimes.job_first_lifetime.get(job)

    def cost(self, prediction: float, machines: IntpArray) -> FloatArray:
        lt = self.lifetimes
        assert lt is not None
        host_long = lt.machine_first_exit(machines) - lt.now >= self.cutoff
        ranks = la_binary_ranks(prediction >= self.cutoff, host_long, lt.occupied(machines))
        return ranks / LA_BINARY_EMPTY
