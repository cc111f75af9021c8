"""Placement policies over a :class:`HostPool`: best fit, LA-Binary and LAS (LAVA is in ``lava.py``).

Every policy chooses one host among feasible candidates by a lexicographic list of
costs (§2.2), bin packing (best fit) always last:

* ``best-fit``: best fit alone, the baseline scheduler (§2.4, §5.3).
* ``la-binary`` (§2.4, §5.3): the LA algorithm of Barbalho et al. with two classes,
  short and long, split at a predicted lifetime of 2 h. A VM's class comes from its
  one-shot prediction at creation; a host's class is that of the longest remaining
  time of its VMs *by their initial predictions* (never repredicted). Preference:
  a non-empty host of the VM's class, then any non-empty host, then an empty one;
  best fit within each.
* ``las`` (§4.2): the temporal cost of the host (from repredicted exit times, see
  :mod:`lifetime_ledger`) one level above best fit.

A policy is bound to the pool (and, if it uses lifetimes, to the ledger) it schedules;
the simulator tells it about placements and removals so stateful policies (LAVA)
can keep their per-host state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from cellpilot.array_types import FloatArray, Int64Array
from cellpilot.lifetimes.lifetime_classes import lifetime_class
from cellpilot.schedule.lifetime_aware.host_pool import HostPool
from cellpilot.schedule.lifetime_aware.lifetime_ledger import LifetimeLedger
from cellpilot.schedule.lifetime_aware.lifetime_scores import (
    HOUR,
    best_fit_cost,
    lexicographic_min,
    temporal_cost,
)

LA_BINARY_CUTOFF = 2.0 * HOUR  # §5.3: the same two-hour cutoff as the LA paper


@dataclass(frozen=True)
class VmRequest:
    """A VM to place: its trace row, shape and predicted remaining lifetime at ``now`` (s).

    ``lifetime_class`` is the LAVA class (§4.3) the predictor assigns; -1 means "the class
    of ``remaining``" (a point predictor). A distribution predictor may assign a class from
    its whole distribution instead (see :mod:`cellpilot.lifetimes.predictors`).
    """

    row: int
    demand: FloatArray  # (3,) cores, memory GiB, SSD GiB
    remaining: float = float("nan")  # repredicted at the VM's current uptime (NaN: no predictor)
    lifetime_class: int = -1

    @property
    def vm_class(self) -> int:
        """The LAVA class to schedule this VM by (§4.3)."""
        return self.lifetime_class if self.lifetime_class >= 0 else int(lifetime_class(self.remaining))


class PlacementPolicy(Protocol):
    name: str

    def choose(self, vm: VmRequest, candidates: Int64Array, now: float) -> int:
        """One host of ``candidates`` (feasible hosts, non-empty array)."""
        ...

    def placed(self, host: int, vm: VmRequest, now: float) -> None: ...

    def removed(self, host: int, row: int, now: float) -> None: ...

    def advance(self, now: float) -> None:
        """Lets time-driven state (LAVA deadlines) catch up with ``now``."""
        ...


class _Stateless:
    def placed(self, host: int, vm: VmRequest, now: float) -> None:
        return None

    def removed(self, host: int, row: int, now: float) -> None:
        return None

    def advance(self, now: float) -> None:
        return None


class BestFit(_Stateless):
    name = "best-fit"

    def __init__(self, pool: HostPool) -> None:
        self.pool = pool

    def choose(self, vm: VmRequest, candidates: Int64Array, now: float) -> int:
        pool = self.pool
        fit = best_fit_cost(pool.capacity[candidates], pool.used[candidates], vm.demand)
        return int(candidates[lexicographic_min([fit])])


class LaBinary(_Stateless):
    """LA-Binary (§2.4, §5.3): one-shot short/long classes at a 2 h cutoff, then best fit."""

    name = "la-binary"

    def __init__(self, pool: HostPool, ledger: LifetimeLedger, cutoff: float = LA_BINARY_CUTOFF) -> None:
        self.pool = pool
        self.ledger = ledger
        self.cutoff = cutoff

    def ranks(self, vm: VmRequest, candidates: Int64Array, now: float) -> Int64Array:
        """0: non-empty host of the VM's class; 1: other non-empty host; 2: empty host."""
        ledger = self.ledger
        vm_long = ledger.first_exit[vm.row] - ledger.created[vm.row] >= self.cutoff
        host_long = ledger.host_first_exit()[candidates] - now >= self.cutoff
        nonempty = self.pool.vm_count[candidates] > 0
        return np.where(nonempty, np.where(host_long == vm_long, 0, 1), 2).astype(np.int64)

    def choose(self, vm: VmRequest, candidates: Int64Array, now: float) -> int:
        pool = self.pool
        fit = best_fit_cost(pool.capacity[candidates], pool.used[candidates], vm.demand)
        return int(candidates[lexicographic_min([self.ranks(vm, candidates, now), fit])])


class Las(_Stateless):
    """LAS (§4.2): temporal cost from repredicted host exit times, one level above best fit."""

    name = "las"

    def __init__(self, pool: HostPool, ledger: LifetimeLedger) -> None:
        self.pool = pool
        self.ledger = ledger

    def temporal_costs(self, vm: VmRequest, candidates: Int64Array, now: float) -> Int64Array:
        self.ledger.refresh(now)
        # An empty host "exits" now: the VM alone sets its exit time.
        host_exit = np.maximum(self.ledger.host_exit()[candidates], now)
        return temporal_cost(now + vm.remaining, host_exit)

    def choose(self, vm: VmRequest, candidates: Int64Array, now: float) -> int:
        pool = self.pool
        fit = best_fit_cost(pool.capacity[candidates], pool.used[candidates], vm.demand)
        return int(candidates[lexicographic_min([self.temporal_costs(vm, candidates, now), fit])])
