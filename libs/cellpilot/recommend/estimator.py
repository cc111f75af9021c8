"""One interface for every vertical recommender kind, and the decorators that compose them.

Autopilot §3.2 runs several recommenders side by side on one job's usage and lets the master
pick one (§3.2.2 "the moving window recommenders", §3.2.3 "the ML recommender"). Here a
recommender *kind* is an :class:`Estimator`: a pure numpy function of the per-job states
that every kind shares, for a batch of J jobs at a time. A worker folds each new window
into the shared states once (:class:`SharedSource`: the decayed histogram of §3.2.2, the
ensemble of §3.2.3), and each kind reads what it needs from the resulting
:class:`SharedView`: one decayed histogram serves the six moving-window statistics, so a new
statistic costs no state at all.

Post-processing (§3.2.2, last paragraph) composes around an estimator:

* :class:`WithMargin`: the safety margin (10-15 %, :class:`~.post_processing.MarginCurve`);
* :class:`~.post_processing.LastHourMax`: "the maximum recommendation value seen over the
  last hour", the one stateful step, whose ring per kind the caller keeps;
* the user's bounds (§3.2 "optional user inputs ... upper and lower bounds on the limits")
  are per-job configuration the master holds, so they stay the master's step on the selected
  value (:func:`cellpilot.autopilot.vertical_targets.bound_limits`), not a worker's.

Which kinds exist, in which output column, and with which decorators is registered data
(:mod:`cellpilot.autopilot.recommender_registry`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Protocol

from cellpilot.array_types import FloatArray, Int64Array
from cellpilot.recommend.ml_ensemble import EnsembleDecision, EnsembleState
from cellpilot.recommend.moving_window import WindowStatistics
from cellpilot.recommend.post_processing import MarginCurve


class SharedSource(StrEnum):
    """A per-job state that recommender kinds share, folded in once per window."""

    WINDOW = "window"  # §3.2.2: the decayed histogram behind every moving-window statistic
    ENSEMBLE = "ensemble"  # §3.2.3: the ensemble's smoothed histograms, limits and costs


@dataclass(frozen=True, eq=False)
class SharedView:
    """What the estimators of one batch read, after its window is folded in (J jobs).

    A source no computed kind reads is not folded in: its fields are None."""

    counts: FloatArray  # (J, K) the window's histograms (with the samples an OOM hid)
    time_ms: Int64Array  # (J,) window ends
    boundaries: FloatArray  # (K,) the bucket scheme's boundaries b[k]
    window: WindowStatistics | None = None  # §3.2.2 statistics of the decayed histogram
    ensemble: EnsembleState | None = None  # §3.2.3 state after the step
    decision: EnsembleDecision | None = None  # §3.2.3 eq. 9's outcome


@dataclass(frozen=True, eq=False)
class Estimate:
    """One kind's output for J jobs (NaN = no recommendation yet)."""

    raw: FloatArray  # (J,) the estimate before any margin
    limit: FloatArray  # (J,) with its margin
    margin: FloatArray  # (J,) the relative margin: limit / raw - 1
    model: Int64Array | None = None  # (J,) which model explains it (the ensemble's m[t]), -1 none
    cost: FloatArray | None = None  # (J,) that model's cost


class Estimator(Protocol):
    """A recommender kind: a pure, vectorised function of the shared per-job states."""

    @property
    def reads(self) -> frozenset[SharedSource]:
        """The shared states it needs (a batch folds in only those some kind reads)."""
        ...

    def estimate(self, view: SharedView) -> Estimate: ...


@dataclass(frozen=True)
class WithMargin:
    """§3.2.2 post-processing: the inner estimate increased by the safety margin."""

    inner: Estimator
    curve: MarginCurve

    @property
    def reads(self) -> frozenset[SharedSource]:
        return self.inner.reads

    def estimate(self, view: SharedView) -> Estimate:
        estimate = self.inner.estimate(view)
        limit, margin = self.curve.apply(estimate.raw)
        return replace(estimate, limit=limit, margin=margin)


__all__ = ["Estimate", "Estimator", "SharedSource", "SharedView", "WithMargin"]
