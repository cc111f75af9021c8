"""Small builders for the lifetime-aware placement tests: hand-made traces, pools and predictors."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cellpilot.lifetimes.vm_table import VmTrace
from cellpilot.schedule.lifetime_aware.host_pool import HostPool, HostShape

HOUR = 3600.0
MINUTE = 60.0
SHAPE = HostShape(cores=10.0, memory_gib=40.0, ssd_gib=0.0)


def trace(
    vms: Sequence[tuple[float, float, float, float]],
    horizon: float | None = None,
    ssd: Sequence[float] | None = None,
) -> VmTrace:
    """VMs as (created, deleted, cores, memory GiB) in seconds, already in creation order."""
    a = np.array(vms, dtype=np.float64).reshape(-1, 4)
    n = a.shape[0]
    return VmTrace(
        vm_id=np.arange(n, dtype=np.int64),
        created=a[:, 0],
        deleted=a[:, 1],
        cores=a[:, 2],
        memory_gib=a[:, 3],
        ssd_gib=np.zeros(n) if ssd is None else np.asarray(ssd, dtype=np.float64),
        category=np.zeros(n, dtype=np.int64),
        owner=np.zeros(n, dtype=np.int64),
        zone=np.zeros(n, dtype=np.int64),
        tier=np.zeros(n, dtype=np.int64),
        horizon=float(a[:, 1].max()) if horizon is None else horizon,
        censored=np.zeros(n, dtype=bool),
    )


def pool(hosts: int = 3, shape: HostShape = SHAPE) -> HostPool:
    return HostPool(hosts, shape)


class FixedPredictor:
    """Predicts a fixed remaining lifetime per VM row, whatever the uptime (minus the uptime if asked)."""

    name = "fixed"

    def __init__(
        self, lifetimes: Sequence[float], repredicts: bool = True, subtract_uptime: bool = False
    ) -> None:
        self.lifetimes = np.asarray(lifetimes, dtype=np.float64)
        self.repredicts = repredicts
        self.subtract_uptime = subtract_uptime
        self.calls: list[tuple[list[int], list[float]]] = []

    def remaining(self, rows: np.ndarray, uptime_seconds: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        uptime = np.broadcast_to(np.asarray(uptime_seconds, dtype=np.float64), rows.shape)
        self.calls.append((rows.tolist(), uptime.tolist()))
        base = self.lifetimes[rows]
        return np.maximum(base - uptime, 0.0) if self.subtract_uptime else base.copy()
