"""The scoring pieces the lifetime-aware policies share, as vectorised functions.

* Bin packing (best fit): the normalised capacity a host has left after the VM is
  placed, summed over dimensions; lower is a tighter fit (the baseline of §2.4/§5.3).
* LAS temporal cost (§4.2): dT = max(vm_exit - host_exit, 0), quantised by the bucket
  boundaries {0, 30 m, 60 m, 90 m, 2 h, 3 h, 4 h, 6 h, 12 h, 24 h, 168 h}; the bucket
  index is the cost (dT = 70 m costs 2).
* LAVA lifetime classes (§4.3) come from :mod:`cellpilot.lifetimes.lifetime_classes`.
* LA-Binary's preference (§2.4, §5.3): a non-empty host of the VM's class (short or long,
  split at a predicted 2 h), then any non-empty host, then an empty one.
* Lexicographic choice (§2.2): the first level decides, later levels break its ties.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from cellpilot.array_types import BoolArray, FloatArray, Int64Array

MINUTE = 60.0
HOUR = 3600.0
LAS_BUCKETS = np.array([0, 30, 60, 90, 120, 180, 240, 360, 720, 1440, 10080], dtype=np.float64) * MINUTE
MAX_TEMPORAL_COST = LAS_BUCKETS.size - 1
LA_BINARY_CUTOFF = 2.0 * HOUR  # §5.3: the same two-hour cutoff as the LA paper
LA_BINARY_EMPTY = 2  # LA-Binary's rank of an empty host (its last choice)


def temporal_cost(vm_exit: float | FloatArray, host_exit: FloatArray) -> Int64Array:
    """LAS temporal cost (§4.2) of putting a VM exiting at ``vm_exit`` on hosts exiting at ``host_exit``."""
    delta = np.maximum(np.asarray(vm_exit, dtype=np.float64) - host_exit, 0.0)
    return (np.searchsorted(LAS_BUCKETS, delta, side="right") - 1).astype(np.int64)


def la_binary_ranks(vm_long: bool, host_long: BoolArray, occupied: BoolArray) -> Int64Array:
    """LA-Binary's preference (§2.4): 0 a non-empty host of the VM's class, 1 another non-empty
    host, 2 (:data:`LA_BINARY_EMPTY`) an empty host; lower is preferred."""
    return np.where(occupied, np.where(host_long == vm_long, 0, 1), LA_BINARY_EMPTY).astype(np.int64)


def best_fit_cost(capacity: FloatArray, used: FloatArray, demand: FloatArray) -> FloatArray:
    """Capacity left after placing ``demand``, as a fraction of each dimension, summed (lower = fuller).

    Cores and memory always count; other dimensions (local SSD) only when the VM asks for
    them, so a VM without SSD is not steered by the hosts' unrelated free SSD.
    """
    left = (capacity - used - demand) / np.where(capacity > 0, capacity, 1.0)
    counted = np.asarray(demand) > 0
    counted[:2] = True
    return np.asarray(left[:, counted].sum(axis=1), dtype=np.float64)


def lexicographic_min(levels: Sequence[npt.NDArray[np.generic]], tolerance: float = 1e-12) -> int:
    """Index of the best (smallest) candidate comparing ``levels`` in order; ties go to the lowest index."""
    if not levels:
        raise ValueError("need at least one level")
    candidates = np.arange(np.asarray(levels[0]).shape[0])
    if candidates.size == 0:
        raise ValueError("no candidates")
    for level in levels:
        column = np.asarray(level, dtype=np.float64)[candidates]
        candidates = candidates[column <= column.min() + tolerance]
        if candidates.size == 1:
            break
    return int(candidates[0])
