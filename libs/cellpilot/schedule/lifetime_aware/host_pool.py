"""A pool of identical hosts and the VMs on them, as arrays (LAVA §2.2: one pool per VM family).

Resources are three dimensions per VM and host: cores, memory (GiB) and local SSD
(GiB), slice-of-hardware style (§2.2): a VM holds its full shape. A host can be taken
out of scheduling (``available`` False) while it is being drained for
defragmentation or maintenance (§4.4). A VM to place is a :class:`VmRequest`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cellpilot.array_types import BoolArray, FloatArray, Int64Array
from cellpilot.lifetimes.lifetime_classes import lifetime_class

RESOURCE_NAMES = ("cores", "memory_gib", "ssd_gib")
CORES, MEMORY, SSD = range(3)
EPSILON = 1e-9


@dataclass(frozen=True)
class HostShape:
    cores: float = 64.0
    memory_gib: float = 256.0
    ssd_gib: float = 3000.0

    def array(self) -> FloatArray:
        return np.array([self.cores, self.memory_gib, self.ssd_gib], dtype=np.float64)


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


class HostPool:
    """Capacity and usage of ``n`` hosts, and which VM rows sit on which host."""

    def __init__(self, n_hosts: int, shape: HostShape | None = None) -> None:
        if n_hosts < 1:
            raise ValueError("a pool needs at least one host")
        self.shape = shape or HostShape()
        self.n = n_hosts
        self.capacity = np.tile(self.shape.array(), (n_hosts, 1))
        self.used = np.zeros((n_hosts, 3))
        self.vm_count = np.zeros(n_hosts, dtype=np.int64)
        self.available = np.ones(n_hosts, dtype=bool)
        self.vms: list[set[int]] = [set() for _ in range(n_hosts)]

    def feasible(self, demand: FloatArray) -> BoolArray:
        """Available hosts with room for ``demand`` in every dimension."""
        return self.available & np.all(self.used + demand <= self.capacity + EPSILON, axis=1)

    def empty(self) -> BoolArray:
        return self.vm_count == 0

    def place(self, host: int, row: int, demand: FloatArray) -> None:
        if row in self.vms[host]:
            raise ValueError(f"VM {row} is already on host {host}")
        self.used[host] += demand
        self.vm_count[host] += 1
        self.vms[host].add(row)

    def remove(self, host: int, row: int, demand: FloatArray) -> None:
        self.vms[host].remove(row)
        self.used[host] -= demand
        self.vm_count[host] -= 1
        if self.vm_count[host] == 0:
            self.used[host] = 0.0  # no rounding residue on an empty host

    def utilisation(self, hosts: Int64Array | int | slice = slice(None)) -> FloatArray:
        return self.used[hosts] / self.capacity[hosts]
