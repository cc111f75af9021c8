"""LAVA (§4.3): lifetime classes and host states on top of LAS, after LLAMA's allocator (§2.5).

Per host: a state (empty, open, recycling), a lifetime class (LC1..LC4 as 0..3, see
:func:`lifetime_class`) and a deadline; per VM: whether it is *residual*.

* An empty host that receives a VM opens with the VM's class; an open host takes
  VMs of its own class. Once more than 90 % of its CPU or memory is allocated it
  turns recycling, and the VMs on it at that moment become its residual VMs.
* A recycling host takes only VMs at least one class shorter than its own.
* Overprediction: when the last residual VM of a recycling host exits, the host
  drops one class and its remaining VMs become the new residuals (§4.3, Figure 5b).
* Underprediction: each host gets a deadline when its class is set; if predictions
  were right it is empty within 1.1x the class's longest lifetime (residuals live up
  to the class bound, gap fillers at most a tenth of it), so the deadline is that.
  While a host is open, every VM of its class placed on it pushes the deadline to
  1.1x the class bound from that placement (the bound holds from the last VM of the
  class, not from the opening). A host still holding VMs at its deadline moves one
  class up and its VMs become residual (§4.3, Figure 5c); an open host that times out
  turns recycling, since it now has residual VMs.
* Preference (§4.3): recycling hosts of a longer class than the VM (the closer the
  better), then open hosts of the VM's class, then any non-empty host, then empty
  hosts. The ``lava`` placement policy (:mod:`.policies`) scores it one level above LAS's
  temporal cost, which breaks its ties, then packing.

Boundaries the paper leaves open, decided here: the class never goes below LC1 (an
LC1 host whose residuals left keeps LC1 with fresh residuals and deadline) nor above
LC4 (a timed-out LC4 host gets a new deadline); a VM placed on a host by the "any
non-empty host" fallback leaves the host's class alone (the deadline catches it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from cellpilot.array_types import FloatArray, Int64Array
from cellpilot.lifetimes.lifetime_classes import NUM_LIFETIME_CLASSES, class_upper
from cellpilot.schedule.lifetime_aware.host_pool import CORES, MEMORY, VmRequest

EMPTY, OPEN, RECYCLING = 0, 1, 2
STATE_NAMES = ("empty", "open", "recycling")
RECYCLE_AT = 0.9  # §4.3: over 90 % of CPU or memory allocated
DEADLINE_FACTOR = 1.1  # §4.3: a host lives at most 1.1x its class if predictions are right

# Preference ranks (lower first): recycling hosts use 0 .. NUM_LIFETIME_CLASSES - 2 by distance.
RANK_OPEN_SAME = NUM_LIFETIME_CLASSES - 1
RANK_NON_EMPTY = NUM_LIFETIME_CLASSES
RANK_EMPTY = NUM_LIFETIME_CLASSES + 1


def lava_ranks(
    vm_class: int, state: Int64Array, host_class: Int64Array, non_empty: npt.NDArray[np.bool_]
) -> Int64Array:
    """§4.3's host preference for a VM of ``vm_class`` (lower is preferred)."""
    rank = np.where(non_empty, RANK_NON_EMPTY, RANK_EMPTY).astype(np.int64)
    rank = np.where((state == OPEN) & (host_class == vm_class), RANK_OPEN_SAME, rank)
    recycling = (state == RECYCLING) & (host_class > vm_class)
    return np.where(recycling, host_class - vm_class - 1, rank)


class PoolView(Protocol):
    """What LAVA's host state machine reads from a pool (a HostPool, or a Borg cell's view)."""

    @property
    def n(self) -> int: ...

    @property
    def used(self) -> FloatArray: ...  # (hosts, >= 2): cores and memory first

    @property
    def capacity(self) -> FloatArray: ...

    @property
    def vm_count(self) -> Int64Array: ...

    @property
    def vms(self) -> Sequence[set[int]]: ...


class LavaHosts:
    """LAVA's per-host state machine (§4.3): states, classes, deadlines, residual VMs."""

    def __init__(self, pool: PoolView) -> None:
        self.pool = pool
        n = pool.n
        self.state = np.full(n, EMPTY, dtype=np.int64)
        self.host_class = np.full(n, -1, dtype=np.int64)
        self.deadline = np.full(n, np.inf)
        self.residuals = np.zeros(n, dtype=np.int64)
        # The host each residual VM is residual on; a migrating VM sits on two hosts for a while.
        self.residual_on: dict[int, int] = {}
        self.reclassified_down = 0
        self.reclassified_up = 0
        self.reclassified_up_open = 0  # of which the host was still open
        self.turned_recycling = 0

    def ranks(self, vm_class: int, hosts: Int64Array) -> Int64Array:
        """§4.3's preference for a VM of lifetime class ``vm_class`` (lower is preferred)."""
        return lava_ranks(vm_class, self.state[hosts], self.host_class[hosts], self.pool.vm_count[hosts] > 0)

    # ------------------------------------------------------------ state changes
    def _set_class(self, host: int, klass: int, now: float) -> None:
        self.host_class[host] = klass
        self.deadline[host] = now + DEADLINE_FACTOR * class_upper(klass)

    def _all_residual(self, host: int) -> None:
        rows = self.pool.vms[host]
        for row in rows:
            other = self.residual_on.get(row, host)
            if other != host:
                self.residuals[other] -= 1
            self.residual_on[row] = host
        self.residuals[host] = len(rows)

    def placed(self, host: int, vm: VmRequest, now: float) -> None:
        """After ``vm`` was added to ``host``."""
        if self.state[host] == EMPTY:
            self.state[host] = OPEN
            self._set_class(host, vm.vm_class, now)
        elif self.state[host] == OPEN and vm.vm_class == self.host_class[host]:
            # A VM of the host's class, placed now, may live to the class bound from now: the
            # 1.1x bound of §4.3 counts from the last such VM, not from the host's opening.
            self.deadline[host] = max(self.deadline[host], now + DEADLINE_FACTOR * class_upper(vm.vm_class))
        if self.state[host] == OPEN:
            dims = [CORES, MEMORY]
            share = self.pool.used[host, dims] / self.pool.capacity[host, dims]
            if np.any(share > RECYCLE_AT):
                self.state[host] = RECYCLING
                self._all_residual(host)
                self.turned_recycling += 1

    def removed(self, host: int, row: int, now: float) -> None:
        """After VM ``row`` left ``host``."""
        if self.residual_on.get(row) == host:
            del self.residual_on[row]
            self.residuals[host] -= 1
        if self.pool.vm_count[host] == 0:
            self.state[host] = EMPTY
            self.host_class[host] = -1
            self.deadline[host] = np.inf
            self.residuals[host] = 0
        elif self.state[host] == RECYCLING and self.residuals[host] == 0:
            # Overprediction: the residuals left early; the rest are one class shorter (Fig. 5b).
            self._set_class(host, max(int(self.host_class[host]) - 1, 0), now)
            self._all_residual(host)
            self.reclassified_down += 1

    def advance(self, now: float) -> None:
        # Underprediction: still occupied at the deadline, one class up (Fig. 5c).
        for host in np.flatnonzero(self.deadline <= now).tolist():
            if self.pool.vm_count[host] == 0:
                continue
            self._set_class(host, min(int(self.host_class[host]) + 1, NUM_LIFETIME_CLASSES - 1), now)
            self._all_residual(host)
            self.reclassified_up += 1
            if self.state[host] == OPEN:
                # Its VMs are now residual (Fig. 5c), so it recycles: shorter VMs fill its gaps, and
                # it steps down when they leave (Fig. 5b), like a host that filled up.
                self.reclassified_up_open += 1
                self.state[host] = RECYCLING
