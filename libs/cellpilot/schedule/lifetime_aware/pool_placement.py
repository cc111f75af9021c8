"""A placement policy over a :class:`HostPool`: the LAVA study's scheduler (LAVA §5.1).

§5.1's simulator replays a trace "against a simulated instance of the scheduler" that
uses the production code base. Here that is literal: :class:`PoolPlacement` builds the
policy's levels (:mod:`.policies`) as the same registered scorer plugins the Borg
scheduler stacks (:mod:`.borg_scorers`), over :class:`PoolLifetimes`, a source of
lifetimes that reads the pool, its :class:`LifetimeLedger` and (for a policy that keeps
them) LAVA's host states. Their scores, highest first, then best fit (§2.4: the capacity
left after placing, lower is fuller) choose one host, lexicographically (§2.2).

Packing is the one level that stays the pool's own: :func:`~.lifetime_scores.best_fit_cost`
is the same idea as the Borg scheduler's ``best-fit`` packing scorer on a different model of
a machine (three VM dimensions, local SSD counted only when the VM asks for it, no placement
basis), and the study's figures are defined by it.

The simulator tells it about placements and removals (LAVA's host states follow them)
and asks it to :meth:`~PoolPlacement.choose` among feasible hosts; before a choice,
LAVA's deadlines catch up with the clock (§4.3) and, for a policy that reads
repredictions, the VMs due for re-evaluation are repredicted in one batch (§3, §4.2).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from cellpilot.array_types import BoolArray, FloatArray, Int64Array, IntpArray
from cellpilot.schedule.lifetime_aware.borg_scorers import LifetimeLevel, Reads
from cellpilot.schedule.lifetime_aware.host_pool import HostPool, VmRequest
from cellpilot.schedule.lifetime_aware.lava import LavaHosts
from cellpilot.schedule.lifetime_aware.lifetime_ledger import LifetimeLedger
from cellpilot.schedule.lifetime_aware.lifetime_scores import best_fit_cost, lexicographic_min
from cellpilot.schedule.lifetime_aware.policies import PlacementPolicy
from cellpilot.schedule.plugins import build_plugin


class PoolLifetimes:
    """The lifetimes a pool's scorers read (``LifetimeSource`` and ``FirstPredictionSource`` of
    :mod:`.borg_scorers`), keyed by VM row: the VM being placed (:meth:`expect`), the ledger's
    repredicted and one-shot host exits, and LAVA's preference when host states are kept."""

    def __init__(self, pool: HostPool, ledger: LifetimeLedger, hosts: LavaHosts | None) -> None:
        self.pool = pool
        self.ledger = ledger
        self.hosts = hosts
        self.now = 0.0
        self.job_remaining: Mapping[int, float] = {}
        self.job_class: Mapping[int, int] = {}
        self.job_first_lifetime: Mapping[int, float] = {}

    def expect(self, vm: VmRequest, now: float) -> None:
        """``vm`` is the one being placed, at ``now``."""
        ledger = self.ledger
        self.now = now
        self.job_remaining = {vm.row: vm.remaining}
        self.job_class = {vm.row: vm.vm_class}
        self.job_first_lifetime = {vm.row: float(ledger.first_exit[vm.row] - ledger.created[vm.row])}

    def machine_exit(self, machines: IntpArray) -> FloatArray:
        # An empty host "exits" now: the VM alone sets its exit time.
        return np.maximum(self.ledger.host_exit()[machines], self.now)

    def ranks(self, vm_class: int, machines: IntpArray) -> Int64Array:
        if self.hosts is None:
            raise ValueError("LAVA's preference needs LAVA's host states: the policy does not keep them")
        return self.hosts.ranks(vm_class, machines)

    def machine_first_exit(self, machines: IntpArray) -> FloatArray:
        return self.ledger.host_first_exit()[machines]

    def occupied(self, machines: IntpArray) -> BoolArray:
        return self.pool.vm_count[machines] > 0


class PoolPlacement:
    """One placement policy bound to the pool (and, if it reads lifetimes, the ledger) it schedules."""

    def __init__(self, policy: PlacementPolicy, pool: HostPool, ledger: LifetimeLedger | None) -> None:
        if policy.needs_lifetimes and ledger is None:
            raise ValueError(f"policy {policy.name!r} needs a lifetime predictor")
        self.policy = policy
        self.pool = pool
        self.ledger = ledger
        self.hosts = LavaHosts(pool) if policy.keeps_host_states else None
        self.lifetimes = PoolLifetimes(pool, ledger, self.hosts) if ledger is not None else None
        self.levels: tuple[LifetimeLevel, ...] = tuple(
            build_plugin("scorer", level, {"lifetimes": self.lifetimes}) for level in policy.levels
        )
        self._repredicts = Reads.PREDICTIONS in policy.needs

    @property
    def name(self) -> str:
        return self.policy.name

    def choose(self, vm: VmRequest, candidates: Int64Array, now: float) -> int:
        """One host of ``candidates`` (feasible hosts, non-empty array)."""
        if self.hosts is not None:
            self.hosts.advance(now)
        costs: list[FloatArray] = []
        if self.levels:
            assert self.lifetimes is not None
            assert self.ledger is not None
            if self._repredicts:
                self.ledger.refresh(now)
            self.lifetimes.expect(vm, now)
            costs = [-level.job_scores(vm.row, candidates) for level in self.levels]
        pool = self.pool
        fit = best_fit_cost(pool.capacity[candidates], pool.used[candidates], vm.demand)
        return int(candidates[lexicographic_min([*costs, fit])])

    def placed(self, host: int, vm: VmRequest, now: float) -> None:
        """After ``vm`` was added to ``host``."""
        if self.hosts is not None:
            self.hosts.placed(host, vm, now)

    def removed(self, host: int, row: int, now: float) -> None:
        """After VM ``row`` left ``host``."""
        if self.hosts is not None:
            self.hosts.removed(host, row, now)
