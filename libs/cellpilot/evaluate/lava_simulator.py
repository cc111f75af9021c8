"""Event-driven replay of VM creations and exits against a host pool (LAVA §5.1).

One run = one trace, one pool, one registered placement policy and (for lifetime-aware
policies) one predictor. The policy schedules the pool through :class:`PoolPlacement`:
the same scorer plugins the Borg scheduler stacks for it, above best fit. VMs already
running at time 0 are placed first, in creation order and with their uptime; then
creations and exits are replayed in time order (exits first at equal times). Measured
over [warmup, end]:

* empty hosts as a percentage of the pool, sampled every ``sample_every`` (§2.3);
* CPU and memory stranding by inflation (§2.3, :mod:`lava_inflation`), every
  ``stranding_every``;
* live migrations (§2.3, §4.4): optionally, a defragmenter drains the
  ``defrag_hosts`` hosts with the fewest VMs whenever empty hosts fall below
  ``defrag_below_pct`` (§4.4), and a rolling maintenance drains hosts in turn. Drained
  hosts are unavailable for scheduling; their VMs move 3 at a time, 20 minutes each
  (§5.1, §4.4), in trace order or LARS order (longest predicted remaining lifetime
  first, :mod:`lars`); targets are chosen by the run's own policy (§4.4). Every
  migration request is recorded so §6.3's order comparison can be replayed.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cellpilot.array_types import FloatArray, Int64Array
from cellpilot.evaluate.lava_diagnostics import ANY, ReplayDiagnostics, per_host_day, placement_reason
from cellpilot.evaluate.lava_inflation import ShapeMix, shape_mix, stranding_pct
from cellpilot.lifetimes.predictors import LifetimePredictor
from cellpilot.lifetimes.vm_table import DAY, HOUR, VmTrace
from cellpilot.schedule.lifetime_aware.host_pool import CORES, MEMORY, HostPool, HostShape, VmRequest
from cellpilot.schedule.lifetime_aware.lars import (
    MIGRATION_SECONDS,
    MIGRATION_SLOTS,
    MigrationOrder,
    migration_key,
)
from cellpilot.schedule.lifetime_aware.lava import RANK_OPEN_SAME
from cellpilot.schedule.lifetime_aware.lifetime_ledger import LifetimeLedger
from cellpilot.schedule.lifetime_aware.policies import placement_policy
from cellpilot.schedule.lifetime_aware.pool_placement import PoolPlacement

Progress = Callable[[float], None]

_SAMPLE, _STRANDING, _DEFRAG, _MAINTENANCE, _MIGRATED = range(5)


@dataclass(frozen=True)
class DrainConfig:
    """Defragmentation and maintenance drains (§4.4); both off when their trigger is 0."""

    defrag_below_pct: float = 0.0  # start draining when empty hosts fall below this share
    defrag_hosts: int = 2  # hosts per defragmentation round
    check_every: float = HOUR
    maintenance_every: float = 0.0  # seconds between rolling-maintenance rounds
    maintenance_hosts: int = 1
    slots: int = MIGRATION_SLOTS
    migration_seconds: float = MIGRATION_SECONDS
    order: MigrationOrder | None = None  # None: LARS when the run has a predictor, else trace order

    def __post_init__(self) -> None:
        if self.defrag_below_pct < 0 or self.maintenance_every < 0 or self.check_every <= 0:
            raise ValueError("defrag_below_pct and maintenance_every must be >= 0, check_every > 0")
        if (
            self.defrag_hosts < 1
            or self.maintenance_hosts < 1
            or self.slots < 1
            or self.migration_seconds <= 0
        ):
            raise ValueError("host counts and slots must be >= 1, migration_seconds > 0")


@dataclass(frozen=True)
class SimulationConfig:
    hosts: int = 100
    host_shape: HostShape = field(default_factory=HostShape)
    warmup: float = DAY  # metrics start here
    end: float | None = None  # default: the trace's horizon
    sample_every: float = 600.0
    stranding_every: float = 6 * HOUR
    drain: DrainConfig = field(default_factory=DrainConfig)
    inflation_seed: int = 0

    def __post_init__(self) -> None:
        if self.hosts < 1 or self.sample_every <= 0 or self.stranding_every <= 0 or self.warmup < 0:
            raise ValueError("hosts >= 1, sample_every > 0, stranding_every > 0, warmup >= 0")


@dataclass
class SimulationResult:
    policy: str
    predictor: str | None
    sample_times: FloatArray
    empty_pct: FloatArray
    stranding_times: FloatArray
    cpu_stranding_pct: FloatArray
    memory_stranding_pct: FloatArray
    placements: int
    failed: int
    migrations: int
    migration_requests: int
    stuck_migrations: int  # VMs that found no target host
    drain_rounds: int
    predictions: int
    request_rows: Int64Array  # the VM of each migration request ...
    request_times: FloatArray  # ... when it was requested ...
    request_ranks: Int64Array  # ... and its rank in trace order
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.policy if self.predictor is None else f"{self.policy}-{self.predictor}"

    def summary(self) -> dict[str, Any]:
        def mean(a: FloatArray) -> float:
            return float(np.mean(a)) if a.size else float("nan")

        return {
            "name": self.name,
            "policy": self.policy,
            "predictor": self.predictor,
            "empty_hosts_pct_mean": mean(self.empty_pct),
            "cpu_stranding_pct": mean(self.cpu_stranding_pct),
            "memory_stranding_pct": mean(self.memory_stranding_pct),
            "migrations": self.migrations,
            "migration_requests": self.migration_requests,
            "placements": self.placements,
            "failed_placements": self.failed,
            "drain_rounds": self.drain_rounds,
            "predictions": self.predictions,
            **self.extra,
        }


class _Run:
    """The mutable state of one simulation."""

    def __init__(
        self, trace: VmTrace, policy: str, predictor: LifetimePredictor | None, config: SimulationConfig
    ) -> None:
        self.trace = trace
        self.config = config
        self.end = trace.horizon if config.end is None else config.end
        self.pool = HostPool(config.hosts, config.host_shape)
        self.ledger = (
            LifetimeLedger(predictor, trace.created, config.hosts) if predictor is not None else None
        )
        self.policy = PoolPlacement(placement_policy(policy), self.pool, self.ledger)
        self.demand = np.column_stack([trace.cores, trace.memory_gib, trace.ssd_gib]).astype(np.float64)
        self.vm_host = np.full(len(trace), -1, dtype=np.int64)
        self.mix: ShapeMix = shape_mix(trace, 0.0, self.end)
        drain = config.drain
        self.order = drain.order or (MigrationOrder.LARS if predictor is not None else MigrationOrder.TRACE)
        self.timers: list[tuple[float, int, int, int, int]] = []  # time, seq, kind, a, b
        self.seq = 0
        self.samples: list[tuple[float, float]] = []
        self.stranding: list[tuple[float, float, float]] = []
        self.placements = self.failed = self.migrations = self.stuck = self.rounds = 0
        self.pending: list[tuple[tuple[float, int], int]] = []
        self.migrating_from: dict[int, int] = {}
        self.draining: set[int] = set()
        self.free_slots = drain.slots
        self.maintenance_next = 0
        self.requests: list[tuple[int, float, int]] = []
        self.defrag_rows: set[int] = set()
        self.diagnostics = ReplayDiagnostics(trace, config.hosts, config.warmup)

    # ------------------------------------------------------------------ timers
    def push(self, when: float, kind: int, a: int = 0, b: int = 0) -> None:
        if when <= self.end:
            self.seq += 1
            heapq.heappush(self.timers, (when, self.seq, kind, a, b))

    def fire(self, when: float, kind: int, a: int, b: int) -> None:
        config = self.config
        if kind == _SAMPLE:
            self.samples.append((when, 100.0 * float(np.mean(self.pool.vm_count == 0))))
            lava = self.policy.hosts
            self.diagnostics.sample(
                when,
                self.pool,
                None if lava is None else lava.state,
                None if lava is None else lava.host_class,
            )
            self.push(when + config.sample_every, _SAMPLE)
        elif kind == _STRANDING:
            free = np.where(self.pool.available[:, None], self.pool.capacity - self.pool.used, 0.0)
            rng = np.random.default_rng([config.inflation_seed, len(self.stranding)])
            pct = stranding_pct(free, self.pool.capacity, self.mix, rng)
            self.stranding.append((when, float(pct[CORES]), float(pct[MEMORY])))
            self.push(when + config.stranding_every, _STRANDING)
        elif kind == _DEFRAG:
            self.defragment(when)
            self.push(when + config.drain.check_every, _DEFRAG)
        elif kind == _MAINTENANCE:
            self.maintain(when)
            self.push(when + config.drain.maintenance_every, _MAINTENANCE)
        elif kind == _MIGRATED:
            self.finish_migration(a, b, when)

    # ------------------------------------------------------------- VM events
    def request(self, row: int, now: float) -> VmRequest:
        if self.ledger is None:
            return VmRequest(row, self.demand[row])
        remaining = self.ledger.predict(row, now)
        return VmRequest(row, self.demand[row], remaining, self.ledger.lifetime_class(row, now))

    def create(self, row: int, now: float) -> None:
        vm = self.request(row, now)
        candidates = np.flatnonzero(self.pool.feasible(vm.demand))
        if candidates.size == 0:
            self.failed += 1
            return
        host = self.policy.choose(vm, candidates, now)
        self.note_placement(host, vm, now)
        self.bind(host, vm, now)
        self.placements += 1

    def note_placement(self, host: int, vm: VmRequest, now: float) -> None:
        reason = ANY
        if self.policy.hosts is not None:
            rank = int(self.policy.hosts.ranks(vm.vm_class, np.array([host], dtype=np.int64))[0])
            reason = placement_reason(rank, RANK_OPEN_SAME)
        self.diagnostics.placed(
            vm.row,
            now,
            vm.remaining,
            reason,
            self.pool.vms[host],
            -1 if np.isnan(vm.remaining) else vm.vm_class,
        )

    def bind(self, host: int, vm: VmRequest, now: float) -> None:
        self.pool.place(host, vm.row, vm.demand)
        if self.ledger is not None:
            self.ledger.attach(vm.row, host)
        self.vm_host[vm.row] = host
        self.policy.placed(host, vm, now)

    def unbind(self, host: int, row: int, now: float) -> None:
        self.pool.remove(host, row, self.demand[row])
        self.policy.removed(host, row, now)
        self.maybe_release(host)

    def delete(self, row: int, now: float) -> None:
        host = int(self.vm_host[row])
        if host < 0:
            return  # never placed
        self.vm_host[row] = -1
        if self.ledger is not None:
            self.ledger.detach(row)
        self.unbind(host, row, now)
        source = self.migrating_from.pop(row, None)
        if source is not None:  # exited mid-migration: both hosts let go, the slot frees
            self.unbind(source, row, now)
            self.free_slots += 1
            self.start_migrations(now)

    # -------------------------------------------------------------- draining
    def maybe_release(self, host: int) -> None:
        if host in self.draining and self.pool.vm_count[host] == 0:
            self.draining.discard(host)
            self.pool.available[host] = True

    def drain(self, hosts: list[int], now: float) -> None:
        if not hosts:
            return
        self.rounds += 1
        if self.ledger is not None:
            self.ledger.refresh(now)
        for host in hosts:
            self.draining.add(host)
            self.pool.available[host] = False
            for row in sorted(self.pool.vms[host]):
                rank = len(self.requests)
                self.requests.append((row, now, rank))
                predicted = float(self.ledger.exit[row]) if self.ledger is not None else 0.0
                heapq.heappush(self.pending, (migration_key(self.order, predicted, rank), row))
        self.start_migrations(now)

    def defragment(self, now: float) -> None:
        """§4.4: drain hosts with few VMs and much free room whose VMs fit on other non-empty hosts."""
        drain = self.config.drain
        if drain.defrag_below_pct <= 0 or self.draining:
            return
        pool = self.pool
        if 100.0 * float(np.mean(pool.vm_count == 0)) >= drain.defrag_below_pct:
            return
        hosts = np.flatnonzero(pool.available & (pool.vm_count > 0))
        capacity = np.where(pool.capacity[hosts] > 0, pool.capacity[hosts], 1.0)
        free_share = ((pool.capacity[hosts] - pool.used[hosts]) / capacity).sum(axis=1)
        order = hosts[np.lexsort((-free_share, pool.vm_count[hosts]))]  # fewest VMs, then most room
        room = np.where(
            (pool.vm_count > 0)[:, None] & pool.available[:, None], pool.capacity - pool.used, -1.0
        )
        chosen: list[int] = []
        for host in order.tolist():
            trial = room.copy()
            trial[[*chosen, host]] = -1.0
            if self._fits_elsewhere(host, trial):
                room = trial
                chosen.append(host)
                if len(chosen) == drain.defrag_hosts:
                    break
        self.defrag_rows.update(r for h in chosen for r in self.pool.vms[h])
        self.drain(chosen, now)

    def _fits_elsewhere(self, host: int, room: FloatArray) -> bool:
        """Greedy check (largest VM first, best fit) that the host's VMs fit in ``room``; updates it."""
        rows = sorted(self.pool.vms[host], key=lambda r: -float(self.demand[r].sum()))
        for row in rows:
            fits = np.flatnonzero(np.all(room >= self.demand[row] - 1e-9, axis=1))
            if fits.size == 0:
                return False
            target = fits[np.argmin((room[fits] - self.demand[row]).sum(axis=1))]
            room[target] -= self.demand[row]
        return True

    def maintain(self, now: float) -> None:
        chosen: list[int] = []
        for _ in range(self.config.drain.maintenance_hosts):
            host = self.maintenance_next
            self.maintenance_next = (host + 1) % self.pool.n
            if host not in self.draining and self.pool.vm_count[host] > 0:
                chosen.append(host)
        self.drain(chosen, now)

    def start_migrations(self, now: float) -> None:
        while self.free_slots > 0 and self.pending:
            _, row = heapq.heappop(self.pending)
            source = int(self.vm_host[row])
            if source < 0 or source not in self.draining or row in self.migrating_from:
                continue  # exited while waiting, or already moved
            vm = self.request(row, now)
            feasible = self.pool.feasible(vm.demand)
            if row in self.defrag_rows:  # defragmentation fills other hosts' gaps, never an empty host
                feasible &= self.pool.vm_count > 0
            candidates = np.flatnonzero(feasible)
            if candidates.size == 0:
                self.stuck += 1
                continue
            target = self.policy.choose(vm, candidates, now)
            self.note_placement(target, vm, now)
            self.migrating_from[row] = source
            self.bind(target, vm, now)  # reserved on the target, still held on the source
            self.migrations += 1
            self.free_slots -= 1
            self.push(now + self.config.drain.migration_seconds, _MIGRATED, row, source)
        if not self.pending and not self.migrating_from:
            for host in list(self.draining):  # nothing left to move: give back what could not drain
                self.draining.discard(host)
                self.pool.available[host] = True

    def finish_migration(self, row: int, source: int, now: float) -> None:
        if self.migrating_from.get(row) != source:
            return  # the VM exited during the migration
        del self.migrating_from[row]
        self.unbind(source, row, now)
        self.free_slots += 1
        self.start_migrations(now)

    # ------------------------------------------------------------------- loop
    def run(self, progress: Progress | None) -> SimulationResult:
        trace, config = self.trace, self.config
        alive = (trace.deleted > 0.0) & (trace.created < self.end)
        rows = np.flatnonzero(alive)
        create_t = np.maximum(trace.created[rows], 0.0)
        ends = rows[trace.deleted[rows] <= self.end]
        times = np.concatenate([create_t, trace.deleted[ends]])
        kinds = np.concatenate([np.ones(rows.size, dtype=np.int64), np.zeros(ends.size, dtype=np.int64)])
        who = np.concatenate([rows, ends])
        order = np.lexsort((who, kinds, times))
        times, kinds, who = times[order], kinds[order], who[order]

        self.push(config.warmup, _SAMPLE)
        self.push(config.warmup, _STRANDING)
        if config.drain.defrag_below_pct > 0:
            self.push(config.drain.check_every, _DEFRAG)
        if config.drain.maintenance_every > 0:
            self.push(config.drain.maintenance_every, _MAINTENANCE)
        total = times.size
        step = max(total // 200, 1)
        for i in range(total):
            t = float(times[i])
            while self.timers and self.timers[0][0] < t:  # a sample at time s sees the events at s
                when, _, kind, a, b = heapq.heappop(self.timers)
                self.fire(when, kind, a, b)
            if kinds[i] == 1:
                self.create(int(who[i]), t)
            else:
                self.delete(int(who[i]), t)
            if progress is not None and i % step == 0:
                progress(i / total)
        while self.timers:
            when, _, kind, a, b = heapq.heappop(self.timers)
            self.fire(when, kind, a, b)
        if progress is not None:
            progress(1.0)
        return self.result()

    def result(self) -> SimulationResult:
        samples = np.array(self.samples).reshape(-1, 2)
        stranding = np.array(self.stranding).reshape(-1, 3)
        requests = np.array(self.requests, dtype=np.float64).reshape(-1, 3)
        measured = max(self.end - self.config.warmup, 0.0)
        extra: dict[str, Any] = {"diagnostics": self.diagnostics.summary(measured / DAY)}
        if self.policy.hosts is not None:
            lava, hosts = self.policy.hosts, self.config.hosts
            extra["diagnostics"]["host_class_changes_per_host_day"] = {
                "down": per_host_day(lava.reclassified_down, hosts, self.end),
                "up": per_host_day(lava.reclassified_up, hosts, self.end),
                "up_while_open": per_host_day(lava.reclassified_up_open, hosts, self.end),
                "to_recycling": per_host_day(lava.turned_recycling, hosts, self.end),
            }
            extra["lava_reclassified_down"] = lava.reclassified_down
            extra["lava_reclassified_up"] = lava.reclassified_up
        predictor = self.ledger.predictor.name if self.ledger is not None else None
        return SimulationResult(
            policy=self.policy.name,
            predictor=predictor,
            sample_times=samples[:, 0],
            empty_pct=samples[:, 1],
            stranding_times=stranding[:, 0],
            cpu_stranding_pct=stranding[:, 1],
            memory_stranding_pct=stranding[:, 2],
            placements=self.placements,
            failed=self.failed,
            migrations=self.migrations,
            migration_requests=len(self.requests),
            stuck_migrations=self.stuck,
            drain_rounds=self.rounds,
            predictions=self.ledger.predictions if self.ledger is not None else 0,
            request_rows=requests[:, 0].astype(np.int64),
            request_times=requests[:, 1],
            request_ranks=requests[:, 2].astype(np.int64),
            extra=extra,
        )


def simulate(
    trace: VmTrace,
    policy: str,
    predictor: LifetimePredictor | None,
    config: SimulationConfig | None = None,
    progress: Progress | None = None,
) -> SimulationResult:
    """Replays ``trace`` against a fresh pool scheduled by ``policy`` (see module doc)."""
    return _Run(trace, policy, predictor, config or SimulationConfig()).run(progress)
