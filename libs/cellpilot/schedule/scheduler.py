"""The scheduling pass: feasibility, scoring, preemption and the §3.4 scale techniques.

Borg §3.2: pending tasks are scanned from high to low priority, round-robin across
users within a priority; for each task the scheduler finds the feasible machines,
scores them, picks the best and, if it lacks room, preempts lower-priority tasks
(victims return to the pending queue).

Borg §3.4 makes this scale with three techniques, each switchable here:

* **equivalence classes** – tasks with identical requirements (the same
  :class:`TaskShape`) share one candidate pool, so feasibility and scores are
  computed once per class, not once per task;
* **score caching** – a pool keeps each examined machine's feasibility and
  machine-dependent scores with the machine's ``version``; only machines whose
  version moved (a task started or ended there, an attribute changed, its
  reservations moved noticeably) are re-evaluated;
* **relaxed randomisation** – machines are examined in a random order until
  ``enough_feasible`` feasible ones are found (plus one per task already placed
  from the pool, so a large job still spreads); the best of those wins.

With all three off, every task evaluates every machine (the "naive" scheduler).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from cellpilot.array_types import BoolArray, FloatArray, IntpArray
from cellpilot.schedule.cell import LIMIT, Cell
from cellpilot.schedule.model import PlacementTask, TaskShape
from cellpilot.schedule.plugins import Request
from cellpilot.schedule.profile import Profile
from cellpilot.schedule.resources import EPSILON, Resources

K = TypeVar("K")
ItemT = TypeVar("ItemT")
V = TypeVar("V")

# A memo of compiled requests or channel vectors is emptied whole past this many entries.
MEMO_LIMIT = 100_000


def _memoised(memo: dict[K, V], key: K, compute: Callable[[], V]) -> V:
    """``memo[key]``, computed on a miss; a memo that outgrew :data:`MEMO_LIMIT` starts over."""
    value = memo.get(key)
    if value is None:
        if len(memo) > MEMO_LIMIT:
            memo.clear()
        value = memo[key] = compute()
    return value


@dataclass(frozen=True)
class SchedulerConfig:
    equivalence_classes: bool = True
    score_cache: bool = True
    relaxed_randomization: bool = True
    enough_feasible: int = 50  # "enough" feasible machines to score (§3.4); not published
    max_cached_entries: int = 2_000_000  # machine entries kept over all cached pools (LRU)
    max_retries: int = 8

    def __post_init__(self) -> None:
        if self.enough_feasible < 1 or self.max_cached_entries < 1 or self.max_retries < 1:
            raise ValueError("enough_feasible, max_cached_entries and max_retries must be >= 1")

    @classmethod
    def naive(cls) -> SchedulerConfig:
        return cls(equivalence_classes=False, score_cache=False, relaxed_randomization=False)


@dataclass(frozen=True)
class Placement:
    task: PlacementTask
    machine: int
    machine_name: str
    handle: int
    alloc: int | None = None
    preempted: tuple[PlacementTask, ...] = ()


@dataclass(frozen=True)
class Unschedulable:
    task: PlacementTask
    reason: str


@dataclass(frozen=True)
class PassResult:
    placements: tuple[Placement, ...]
    unschedulable: tuple[Unschedulable, ...]
    preempted: tuple[PlacementTask, ...]

    @property
    def pending(self) -> tuple[PlacementTask, ...]:
        """What goes back to the pending queue: unplaced tasks and preemption victims."""
        return tuple(u.task for u in self.unschedulable) + self.preempted


@dataclass
class SchedulerStats:
    machines_evaluated: int = 0  # feasibility + machine-dependent scores computed
    placements: int = 0
    pools_built: int = 0


class _Pool:
    """The machines examined for one equivalence class, with cached results."""

    __slots__ = ("feas", "idx", "levels", "machine_epoch", "placed", "req", "score_epoch", "start", "ver")

    def __init__(self, req: Request, n_levels: int, start: int, machine_epoch: int, score_epoch: int) -> None:
        self.req = req
        self.idx: IntpArray = np.empty(0, dtype=np.intp)
        self.ver = np.empty(0, dtype=np.int64)
        self.feas: BoolArray = np.empty(0, dtype=bool)
        self.levels: FloatArray = np.empty((0, n_levels))
        self.start = start
        self.machine_epoch = machine_epoch
        self.score_epoch = score_epoch
        self.placed = 0


def pending_order(tasks: Sequence[PlacementTask]) -> list[PlacementTask]:
    """High to low priority; round-robin across users within a priority (§3.2)."""
    return priority_round_robin(tasks, lambda task: (task.priority, task.user))


def priority_round_robin(items: Iterable[ItemT], key: Callable[[ItemT], tuple[int, str]]) -> list[ItemT]:
    """``items`` high to low priority, round-robin across users within a priority (Borg §3.2);
    ``key`` gives an item's (priority, user). Stable: a user's items keep their order."""
    by_priority: dict[int, dict[str, list[ItemT]]] = {}
    for item in items:
        priority, user = key(item)
        by_priority.setdefault(priority, {}).setdefault(user, []).append(item)
    ordered: list[ItemT] = []
    for priority in sorted(by_priority, reverse=True):
        queues = list(by_priority[priority].values())
        longest = max(len(q) for q in queues)
        for i in range(longest):
            ordered.extend(q[i] for q in queues if i < len(q))
    return ordered


@dataclass
class Scheduler:
    """Places tasks into a :class:`Cell`; keeps its caches between passes."""

    profile: Profile
    config: SchedulerConfig = field(default_factory=SchedulerConfig)
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))
    stats: SchedulerStats = field(default_factory=SchedulerStats)

    def __post_init__(self) -> None:
        self._pools: OrderedDict[Hashable, _Pool] = OrderedDict()
        self._entries = 0
        self._requests: dict[TaskShape, Request] = {}
        self._amounts: dict[tuple[TaskShape, Resources], FloatArray] = {}
        self._cell_uid = -1
        self._order: IntpArray = np.empty(0, dtype=np.intp)
        self._order_epoch = -1

    # ------------------------------------------------------------------ API
    def schedule(self, cell: Cell, pending: Sequence[PlacementTask], now: float) -> PassResult:
        """One scheduling pass over ``pending``."""
        self._attach(cell)
        self._publish_shape(cell, pending)
        placements: list[Placement] = []
        failed: list[Unschedulable] = []
        preempted: list[PlacementTask] = []
        for task in pending_order(pending):
            outcome = self._place(cell, task, now)
            if isinstance(outcome, Placement):
                placements.append(outcome)
                preempted.extend(outcome.preempted)
            else:
                failed.append(outcome)
        # Victims have lower priority than their preemptor, so none of them was placed
        # later in this pass: they all go back to the pending queue (§3.2).
        return PassResult(tuple(placements), tuple(failed), tuple(preempted))

    def place(self, cell: Cell, task: PlacementTask, now: float) -> Placement | Unschedulable:
        """Places one task (an online arrival)."""
        self._attach(cell)
        return self._place(cell, task, now)

    def place_on(
        self, cell: Cell, task: PlacementTask, machine: int, now: float
    ) -> Placement | Unschedulable:
        """Places ``task`` on the named ``machine`` if it still fits there, with the checks a pass
        makes (every filter, then the exact fit with the preemptor's victims), and binds it.

        Borg §3.4: the elected master accepts a scheduler's assignment "unless it is
        inappropriate (e.g., based on out of date state)"; this is that test, so a proposal is
        judged by the very code that chose it. A task of an alloc set goes into the alloc on
        that machine with the least room left after it.
        """
        self._attach(cell)
        if task.task_id in cell.task_handle:
            return Unschedulable(task, "already running")
        if not 0 <= machine < cell.n_machines or not cell.alive[machine]:
            return Unschedulable(task, "the machine is gone")
        if task.shape.alloc_set is not None:
            return self._place_in_alloc(cell, task, now, only_machine=machine)
        req = self._request(task.shape)
        req.job = cell.job_code(task.job)
        rows = np.array([machine], dtype=np.intp)
        for f in self.profile.filters:
            if not f.feasible(cell, req, rows)[0]:
                return Unschedulable(task, f"no longer feasible there ({f.name})")
        victims = self.profile.preemptor.victims(cell, req, machine, self.profile.fits)
        if victims is None:
            return Unschedulable(task, "no longer fits there")
        evicted: list[PlacementTask] = []
        for victim in victims.tolist():
            if cell.t_alive[victim]:
                evicted += cell.unbind(victim)
        handle = cell.bind(task, machine, now, amount=self._amount(cell, task, req))
        self.stats.placements += 1
        return Placement(task, machine, cell.machine_names[machine], handle, None, tuple(evicted))

    def invalidate(self) -> None:
        """Drops every cached pool (e.g. after swapping the profile)."""
        self._pools.clear()
        self._entries = 0

    # ------------------------------------------------------------------ internals
    def _attach(self, cell: Cell) -> None:
        if cell.uid != self._cell_uid:
            self.invalidate()
            self._cell_uid = cell.uid
            self._order_epoch = -1
        if self._order_epoch != cell.machine_epoch:
            n = cell.n_machines
            self._order = (
                self.rng.permutation(n).astype(np.intp)
                if self.config.relaxed_randomization
                else np.arange(n, dtype=np.intp)
            )
            self._order_epoch = cell.machine_epoch

    def _publish_shape(self, cell: Cell, pending: Sequence[PlacementTask]) -> None:
        counts: dict[TaskShape, int] = {}
        for task in pending:
            if task.shape.alloc_set is None:
                counts[task.shape] = counts.get(task.shape, 0) + 1
        total = np.zeros(LIMIT.stop)
        for shape, count in counts.items():
            total += count * shape.limits.array()
        cell.publish_anticipated_shape(total, sum(counts.values()))

    def _request(self, shape: TaskShape) -> Request:
        return _memoised(self._requests, shape, lambda: Request.compile(shape))

    def _place(self, cell: Cell, task: PlacementTask, now: float) -> Placement | Unschedulable:
        if task.task_id in cell.task_handle:
            return Unschedulable(task, "already running")
        if task.shape.alloc_set is not None:
            return self._place_in_alloc(cell, task, now)
        pool = self._pool_for(cell, task)
        req = pool.req
        req.job = cell.job_code(task.job)
        for _ in range(self.config.max_retries):
            row = self._choose(cell, pool, req)
            if row < 0:
                return Unschedulable(task, f"no feasible machine among {pool.idx.size} examined")
            machine = int(pool.idx[row])
            victims = self.profile.preemptor.victims(cell, req, machine, self.profile.fits)
            if victims is None:
                # Cached feasibility ignored a small change; this machine is out for now.
                pool.feas[row] = False
                pool.ver[row] = cell.version[machine]
                continue
            evicted: list[PlacementTask] = []
            for victim in victims.tolist():
                if cell.t_alive[victim]:
                    evicted += cell.unbind(victim)
            handle = cell.bind(task, machine, now, amount=self._amount(cell, task, req))
            pool.placed += 1
            self.stats.placements += 1
            return Placement(task, machine, cell.machine_names[machine], handle, None, tuple(evicted))
        return Unschedulable(task, "feasible machines kept failing the exact fit check")

    def _amount(self, cell: Cell, task: PlacementTask, req: Request) -> FloatArray:
        """The task's channel vector; tasks of a job share it, so it is computed once."""
        if task.reservation is None:
            return req.amount
        return _memoised(self._amounts, (task.shape, task.reservation), lambda: cell.task_amount(task))

    def _pool_for(self, cell: Cell, task: PlacementTask) -> _Pool:
        key: Hashable = task.shape if self.config.equivalence_classes else task.task_id
        if self.config.score_cache:
            pool = self._pools.get(key)
            if pool is not None and pool.machine_epoch == cell.machine_epoch:
                self._pools.move_to_end(key)
                return pool
            if pool is not None:
                self._drop(key)
        req = self._request(task.shape)
        start = int(self.rng.integers(max(cell.n_machines, 1))) if self.config.relaxed_randomization else 0
        pool = _Pool(req, len(self.profile.scoring.levels), start, cell.machine_epoch, cell.score_epoch)
        self.stats.pools_built += 1
        if self.config.score_cache:
            self._pools[key] = pool
        return pool

    def _drop(self, key: Hashable) -> None:
        pool = self._pools.pop(key)
        self._entries -= pool.idx.size

    def _choose(self, cell: Cell, pool: _Pool, req: Request) -> int:
        """Row in the pool of the best feasible machine, or -1."""
        if pool.idx.size:
            self._refresh(cell, pool, req)
        if self.config.relaxed_randomization:
            target = self.config.enough_feasible + pool.placed
            have = int(np.count_nonzero(pool.feas))
            if have < target:
                self._extend(cell, pool, req, target - have)
        elif pool.idx.size < cell.n_machines:
            self._extend(cell, pool, req, cell.n_machines)
        rows = pool.feas.nonzero()[0]
        if rows.size == 0:
            return -1
        scoring = self.profile.scoring
        if rows.size == 1:
            return int(rows[0])
        matrix = pool.levels[rows]
        if scoring.job_columns:
            scoring.fill_job_levels(cell, req, pool.idx[rows], matrix)
        return int(rows[scoring.select(matrix)])

    def _refresh(self, cell: Cell, pool: _Pool, req: Request) -> None:
        if pool.score_epoch != cell.score_epoch:
            rows = pool.feas.nonzero()[0]
            if rows.size:
                pool.levels[rows] = self.profile.scoring.machine_levels(cell, req, pool.idx[rows])
                self.stats.machines_evaluated += rows.size
            pool.score_epoch = cell.score_epoch
        stale = (cell.version[pool.idx] != pool.ver).nonzero()[0]
        if stale.size:
            self._evaluate(cell, pool, req, stale)

    def _evaluate(self, cell: Cell, pool: _Pool, req: Request, rows: IntpArray) -> int:
        machines = pool.idx[rows]
        ok = np.ones(rows.size, dtype=bool)
        for f in self.profile.filters:
            ok &= f.feasible(cell, req, machines)
        pool.feas[rows] = ok
        pool.ver[rows] = cell.version[machines]
        good = rows[ok]
        if good.size:
            pool.levels[good] = self.profile.scoring.machine_levels(cell, req, pool.idx[good])
        self.stats.machines_evaluated += rows.size
        return int(good.size)

    def _extend(self, cell: Cell, pool: _Pool, req: Request, want: int) -> None:
        n = cell.n_machines
        examined = pool.idx.size
        while want > 0 and examined < n:
            have = int(np.count_nonzero(pool.feas))
            fraction = max(have / examined, 0.05) if examined else 1.0
            chunk = min(n - examined, max(32, int(np.ceil(1.25 * want / fraction))))
            positions = (pool.start + np.arange(examined, examined + chunk)) % n
            machines = self._order[positions]
            pool.idx = np.concatenate([pool.idx, machines])
            pool.ver = np.concatenate([pool.ver, np.zeros(chunk, dtype=np.int64)])
            pool.feas = np.concatenate([pool.feas, np.zeros(chunk, dtype=bool)])
            pool.levels = np.concatenate([pool.levels, np.zeros((chunk, pool.levels.shape[1]))])
            want -= self._evaluate(cell, pool, req, np.arange(examined, examined + chunk))
            examined += chunk
            if self.config.score_cache:
                self._entries += chunk
        pool.score_epoch = cell.score_epoch
        while self._entries > self.config.max_cached_entries and len(self._pools) > 1:
            self._drop(next(iter(self._pools)))

    def _place_in_alloc(
        self, cell: Cell, task: PlacementTask, now: float, only_machine: int | None = None
    ) -> Placement | Unschedulable:
        """A task of an alloc set goes into the alloc with the least room left after it (§2.4)
        (among those on ``only_machine`` if given)."""
        name = task.shape.alloc_set
        assert name is not None
        allocs = np.array(sorted(cell.alloc_sets.get(name, ())), dtype=np.intp)
        if only_machine is not None:
            allocs = allocs[cell.t_machine[allocs] == only_machine] if allocs.size else allocs
        if allocs.size == 0:
            return Unschedulable(task, f"alloc set {name!r} has no allocs")
        need = task.shape.limits.array()
        free = cell.t_amount[allocs, LIMIT] - cell.t_inner[allocs]
        ok = np.all(free >= need - EPSILON, axis=1)
        if not ok.any():
            return Unschedulable(task, f"no alloc of set {name!r} has room")
        size = np.where(cell.t_amount[allocs, LIMIT] > 0, cell.t_amount[allocs, LIMIT], 1.0)
        left = ((free - need) / size).sum(axis=1)
        left[~ok] = np.inf
        alloc = int(allocs[int(np.argmin(left))])
        machine = int(cell.t_machine[alloc])
        handle = cell.bind(task, machine, now, alloc=alloc)
        self.stats.placements += 1
        return Placement(task, machine, cell.machine_names[machine], handle, alloc)
