"""Resource stranding by inflation (LAVA §2.3).

§2.3 measures stranding with periodic inflation simulations: take a representative
mix of VMs, schedule as many of them as possible until capacity is exhausted; what
is still free on the hosts then is stranded (e.g. memory on a host without free
cores). Here the mix is the trace's VM shapes weighted by VM-hours (the mix a pool
holds at a random moment), VMs are drawn from it at random and placed by best fit,
and a shape is dropped from the mix once it fits nowhere; inflation ends when no
shape fits. Stranding is reported per dimension as a percentage of the pool's
capacity.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cellpilot.lifetimes.vm_table import VmTrace

FloatArray = npt.NDArray[np.float64]

EPSILON = 1e-9


@dataclass(frozen=True)
class ShapeMix:
    shapes: FloatArray  # (S, 3) cores, memory GiB, SSD GiB
    weights: FloatArray  # (S,) > 0

    def __post_init__(self) -> None:
        if (
            self.shapes.ndim != 2
            or self.shapes.shape[0] != self.weights.shape[0]
            or self.shapes.shape[0] == 0
        ):
            raise ValueError("a shape mix needs one weight per shape and at least one shape")
        if np.any(self.weights <= 0) or np.any(self.shapes < 0) or np.any(self.shapes.sum(axis=1) <= 0):
            raise ValueError("weights must be > 0 and shapes non-negative and non-zero")


def shape_mix(trace: VmTrace, start: float = 0.0, end: float | None = None) -> ShapeMix:
    """The trace's VM shapes weighted by the VM-hours they spend inside [start, end]."""
    end = trace.horizon if end is None else end
    hours = np.clip(np.minimum(trace.deleted, end) - np.maximum(trace.created, start), 0.0, None) / 3600.0
    shapes = np.column_stack([trace.cores, trace.memory_gib, trace.ssd_gib])
    keep = hours > 0
    if not keep.any():
        keep = np.ones_like(keep)
        hours = np.ones_like(hours)
    unique, inverse = np.unique(shapes[keep], axis=0, return_inverse=True)
    weights = np.bincount(inverse.reshape(-1), weights=hours[keep], minlength=unique.shape[0])
    ok = weights > 0
    return ShapeMix(unique[ok].astype(np.float64), weights[ok].astype(np.float64))


def inflate(free: FloatArray, capacity: FloatArray, mix: ShapeMix, rng: np.random.Generator) -> FloatArray:
    """Free resources (n, 3) left after filling ``free`` with VMs drawn from ``mix`` by best fit."""
    free = np.array(free, dtype=np.float64, copy=True)
    scale = np.where(capacity > 0, capacity, 1.0)
    active = np.ones(mix.weights.shape[0], dtype=bool)
    # A shape that does not fit any host now never will: capacity only shrinks.
    fits_any = np.array([np.any(np.all(free >= s - EPSILON, axis=1)) for s in mix.shapes])
    active &= fits_any
    while active.any():
        idx = np.flatnonzero(active)
        cum = np.cumsum(mix.weights[idx])
        s = int(idx[min(int(np.searchsorted(cum, rng.random() * cum[-1], side="right")), idx.size - 1)])
        shape = mix.shapes[s]
        fits = np.flatnonzero(np.all(free >= shape - EPSILON, axis=1))
        if fits.size == 0:
            active[s] = False
            continue
        left = ((free[fits] - shape) / scale[fits]).sum(axis=1)
        host = int(fits[np.argmin(left)])
        free[host] -= shape
    return np.maximum(free, 0.0)


def stranding_pct(
    free: FloatArray, capacity: FloatArray, mix: ShapeMix, rng: np.random.Generator
) -> FloatArray:
    """Per dimension, stranded resources after inflation as a percentage of total capacity."""
    left = inflate(free, capacity, mix, rng)
    total = capacity.sum(axis=0)
    return np.asarray(100.0 * left.sum(axis=0) / np.where(total > 0, total, 1.0), dtype=np.float64)
