"""The VM table the lifetime predictors and the lifetime-aware placement study read (LAVA §2.1, §5.1).

A :class:`VmTrace` is a column table of VMs: creation and deletion times (seconds
from the trace start), the shape (cores, memory, local SSD) and categorical
features (workload category, owner, zone, tier). VMs already running when the
trace starts have a negative creation time, so a replay sees their true uptime.
Tables come from the synthetic generator (:mod:`cellpilot.workloads.vm_trace`) or a
trace reader (:mod:`cellpilot.traces.azure`); here is what every consumer shares: the
table, its lifetime statistics, windows and thinning.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

MINUTE = 60.0
HOUR = 3600.0
DAY = 86400.0


@dataclass(frozen=True)
class VmTrace:
    """A column table of VMs (one row per VM); times in seconds from the trace start."""

    vm_id: IntArray
    created: FloatArray
    deleted: FloatArray  # may exceed ``horizon`` (the VM outlives the trace)
    cores: FloatArray
    memory_gib: FloatArray
    ssd_gib: FloatArray
    category: IntArray
    owner: IntArray
    zone: IntArray
    tier: IntArray
    horizon: float  # the trace ends at this time (seconds)
    censored: BoolArray  # True: the VM was still running when it was observed last
    category_names: tuple[str, ...] = ()
    tier_names: tuple[str, ...] = ()
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        n = self.created.shape[0]
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, np.ndarray) and value.shape != (n,):
                raise ValueError(f"column {f.name} has shape {value.shape}, expected ({n},)")
        if np.any(self.deleted < self.created):
            raise ValueError("a VM cannot be deleted before it is created")
        if np.any(self.cores <= 0) or np.any(self.memory_gib <= 0) or np.any(self.ssd_gib < 0):
            raise ValueError("VM shapes need cores > 0, memory > 0 and ssd >= 0")

    def __len__(self) -> int:
        return int(self.created.shape[0])

    @property
    def lifetime(self) -> FloatArray:
        """Seconds from creation to deletion (a lower bound where ``censored``)."""
        return self.deleted - self.created

    def subset(self, mask: npt.ArrayLike) -> VmTrace:
        """The rows selected by a boolean mask or an index array, in that order."""
        rows = np.asarray(mask)
        columns = {
            f.name: getattr(self, f.name)[rows]
            for f in fields(self)
            if isinstance(getattr(self, f.name), np.ndarray)
        }
        return VmTrace(
            **columns,
            horizon=self.horizon,
            category_names=self.category_names,
            tier_names=self.tier_names,
            source=self.source,
        )


def lifetime_shape(trace: VmTrace, cutoff: float = HOUR) -> dict[str, float]:
    """The lifetime statistics LAVA quotes, for the VMs created inside the trace.

    §2.1: ``vm_share_short``, the fraction of VMs living less than ``cutoff`` (1 h), and
    ``core_hours_share_long``, the fraction of core-hours used by VMs living ``cutoff``
    or more. Figure 2: ``mean_lifetime_days`` (E[L] at scheduling time) and the
    expected remaining lifetime after 1 and 7 days of uptime, E[L - u | L > u].
    """
    inside = trace.created >= 0.0
    life = trace.lifetime[inside]
    core_seconds = life * trace.cores[inside]
    short = life < cutoff
    total = float(core_seconds.sum())

    def remaining_after(uptime: float) -> float:
        alive = life > uptime
        return float(np.mean(life[alive] - uptime) / DAY) if alive.any() else 0.0

    return {
        "vms": float(inside.sum()),
        "vm_share_short": float(short.mean()) if life.size else 0.0,
        "core_hours_share_long": float(core_seconds[~short].sum() / total) if total > 0 else 0.0,
        "mean_lifetime_days": float(life.mean() / DAY) if life.size else 0.0,
        "remaining_after_1d_days": remaining_after(DAY),
        "remaining_after_7d_days": remaining_after(7 * DAY),
    }


def window_trace(trace: VmTrace, start: float, end: float) -> VmTrace:
    """The VMs alive at some point in [start, end), with times shifted so ``start`` becomes 0.

    VMs created before ``start`` keep their (now negative) creation time; a VM whose
    recorded deletion lies beyond ``end`` is only censored if it was censored already.
    """
    if end <= start:
        raise ValueError("the window must end after it starts")
    keep = (trace.deleted > start) & (trace.created < end)
    sub = trace.subset(keep)
    return VmTrace(
        vm_id=sub.vm_id,
        created=sub.created - start,
        deleted=sub.deleted - start,
        cores=sub.cores,
        memory_gib=sub.memory_gib,
        ssd_gib=sub.ssd_gib,
        category=sub.category,
        owner=sub.owner,
        zone=sub.zone,
        tier=sub.tier,
        horizon=end - start,
        censored=sub.censored,
        category_names=sub.category_names,
        tier_names=sub.tier_names,
        source=sub.source,
    )


def thin_to_pool(
    trace: VmTrace, rng: np.random.Generator, capacity_cores: float, utilisation: float
) -> VmTrace:
    """Keeps a random subset of VMs so that on average ``utilisation`` of ``capacity_cores`` is allocated.

    For replaying a region-wide trace (such as Azure's) against one pool; a trace that
    is already light enough is returned unchanged.
    """
    span = trace.horizon
    inside = np.clip(np.minimum(trace.deleted, span) - np.maximum(trace.created, 0.0), 0.0, None)
    mean_cores = float(np.sum(inside * trace.cores) / span) if span > 0 else 0.0
    if mean_cores <= utilisation * capacity_cores:
        return trace
    keep = rng.random(len(trace)) < utilisation * capacity_cores / mean_cores
    return trace.subset(keep)
