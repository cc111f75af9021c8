"""An optional decorator for CPU recommenders: more CPU for a job whose demand went unserved.

Every recommender of Autopilot §3.2 learns from the CPU the job's tasks *used*. A task that
was throttled used less than it wanted — its machine had no spare CPU and its limit was
enforced (Autopilot §2.3, Borg §6.2) — so its usage histogram understates its demand and a
limit fitted to it keeps it throttled. The Borglets measure the unmet demand of every sample,
and each job histogram carries its window mean (``UsageHistogram.mean_total_unmet``) beside
the mean served usage (``mean_total_usage``). This decorator scales a job's CPU
recommendation by demand over served usage,

    factor = (usage + unmet) / usage,   clipped to [1, max_factor],

when the unmet share ``unmet / (usage + unmet)`` reaches ``min_unmet_fraction``; otherwise it
leaves the value alone. It is stateless: once the raised limit lets the tasks use what they
demand, the histograms themselves carry the higher usage and no unmet demand remains.

Off by default (the paper's recommenders do not do this); a recommender worker turns it on
with ``CELLPILOT_RECOMMENDER_RAISE_CPU_FOR_UNMET_DEMAND``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cellpilot.array_types import BoolArray, FloatArray


@dataclass(frozen=True)
class RaiseForUnmetDemand:
    min_unmet_fraction: float = 0.02  # smaller shares of unserved demand change nothing
    max_factor: float = 2.0  # at most this much more CPU from one window

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_unmet_fraction < 1.0:
            raise ValueError("min_unmet_fraction must be in [0, 1)")
        if not self.max_factor >= 1.0:
            raise ValueError("max_factor must be >= 1")

    def factor(self, usage: npt.ArrayLike, unmet: npt.ArrayLike) -> FloatArray:
        """Per job: how much to scale its CPU recommendation (1 = unchanged)."""
        used = np.maximum(np.asarray(usage, dtype=np.float64), 0.0)
        missing = np.maximum(np.nan_to_num(np.asarray(unmet, dtype=np.float64)), 0.0)
        demand = used + missing
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(demand > 0, missing / demand, 0.0)
            ratio = np.where(used > 0, demand / used, self.max_factor)
        scale = np.clip(ratio, 1.0, self.max_factor)
        return np.where((share >= self.min_unmet_fraction) & (missing > 0), scale, 1.0)

    def apply(
        self, values: npt.ArrayLike, usage: npt.ArrayLike, unmet: npt.ArrayLike
    ) -> tuple[FloatArray, BoolArray]:
        """``values`` (J,) or (J, C) recommendations scaled per job; and which jobs were raised."""
        v = np.asarray(values, dtype=np.float64)
        f = self.factor(usage, unmet)
        scaled = v * (f[:, None] if v.ndim == 2 else f)
        return scaled, f > 1.0
