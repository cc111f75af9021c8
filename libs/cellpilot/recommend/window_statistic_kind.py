"""The moving-window recommenders (Autopilot §3.2.2) as estimators: one statistic each.

S_max, S_avg, S_p90, S_p95, S_p98 and max(S_p60, 0.5 S_max) all read the one decayed
histogram a worker keeps per job (:class:`~cellpilot.recommend.moving_window.WindowState`,
eqs. 1-3); each is :func:`~cellpilot.recommend.policy.evaluate_statistics` for its statistic.
The safety margin and the max over the last hour are decorators registered with it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cellpilot.recommend.estimator import Estimate, SharedSource, SharedView
from cellpilot.recommend.policy import Statistic, evaluate_statistics


@dataclass(frozen=True)
class WindowStatisticEstimator:
    """§3.2.2: one statistic of the job's decayed usage histogram, before any margin."""

    statistic: Statistic

    @property
    def reads(self) -> frozenset[SharedSource]:
        return frozenset({SharedSource.WINDOW})

    def estimate(self, view: SharedView) -> Estimate:
        if view.window is None:
            raise ValueError("the moving-window statistics were not computed for this batch")
        jobs = view.time_ms.shape[0]
        raw, _ = evaluate_statistics(np.full(jobs, self.statistic, np.int8), view.window)
        return Estimate(raw=raw, limit=raw, margin=np.zeros(jobs))


__all__ = ["WindowStatisticEstimator"]
