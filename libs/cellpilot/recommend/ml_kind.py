"""The ML recommender (Autopilot §3.2.3) as an estimator: the ensemble's eq. 9 choice.

The ensemble's state (:class:`~cellpilot.recommend.ml_ensemble.EnsembleState`, eqs. 4-8) is
folded in once per window by the caller; this kind reads its decision. Its margins are the
models' own (eq. 7), so it takes no safety-margin decorator; a job with no usage yet (an
empty smoothed histogram) has no recommendation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cellpilot.recommend.estimator import Estimate, SharedSource, SharedView


@dataclass(frozen=True)
class EnsembleEstimator:
    """§3.2.3: L[t] of eq. 9, its model's limit before the margin, the model and its cost."""

    @property
    def reads(self) -> frozenset[SharedSource]:
        return frozenset({SharedSource.ENSEMBLE})

    def estimate(self, view: SharedView) -> Estimate:
        if view.ensemble is None or view.decision is None:
            raise ValueError("the ensemble was not stepped for this batch")
        decision = view.decision
        has_usage = view.ensemble.smoothed[:, 0, :].sum(axis=1) > 0.0
        with np.errstate(divide="ignore", invalid="ignore"):
            relative = decision.limit / decision.raw_limit - 1.0
        return Estimate(
            raw=np.where(has_usage, decision.raw_limit, np.nan),
            limit=np.where(has_usage, decision.limit, np.nan),
            margin=np.where(has_usage, relative, np.nan),
            model=np.where(has_usage, decision.model, -1).astype(np.int64),
            cost=np.where(has_usage, decision.cost, np.nan),
        )


__all__ = ["EnsembleEstimator"]
