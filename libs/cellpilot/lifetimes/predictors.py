"""Where a placement policy gets remaining lifetimes: the learned model or an oracle (LAVA §6.1).

A predictor is bound to one trace: VMs are named by their row in it, and the caller
passes each VM's current uptime. The model predictor is what runs in production
(§3); the oracle knows every VM's true deletion time and gives the "perfect
(oracular) predictor" comparison point of §6.1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from cellpilot.array_types import FloatArray, Int64Array
from cellpilot.lifetimes.distribution import LifetimeDistribution
from cellpilot.lifetimes.distribution_model import DistributionModel
from cellpilot.lifetimes.features import vm_features
from cellpilot.lifetimes.lifetime_classes import LIFETIME_CLASS_UPPER
from cellpilot.lifetimes.model import LifetimeModel
from cellpilot.lifetimes.vm_table import VmTrace

SMALL_BATCH = 16  # up to this many VMs, predict one by one (see ModelPredictor.remaining)
# LAVA's risk class (see DistributionPredictor): the shipped setting of the study and the live cell.
DEFAULT_CLASS_RISK = 0.05


def risk_classes(dist: LifetimeDistribution, uptime_seconds: npt.ArrayLike, class_risk: float) -> Int64Array:
    """LAVA's class (§4.3) from a lifetime distribution: per VM, the shortest class whose upper
    bound its remaining lifetime (at ``uptime_seconds``) exceeds with probability <= ``class_risk``."""
    if not 0.0 < class_risk < 1.0:
        raise ValueError("class_risk must be in (0, 1)")
    survive = np.column_stack(
        [dist.survival(upper, uptime_seconds) for upper in LIFETIME_CLASS_UPPER[:-1]]
    ).reshape(len(dist), -1)
    return np.asarray(np.sum(survive > class_risk, axis=1), dtype=np.int64)


@dataclass(frozen=True)
class LifetimeEstimates:
    """Per VM (or task): E[T_r | T_u] in seconds (§3, what LAS and LARS use) and LAVA's class (§4.3)."""

    remaining: FloatArray
    lifetime_class: Int64Array


def estimate_lifetimes(
    model: DistributionModel,
    features: FloatArray,
    uptime_seconds: npt.ArrayLike,
    class_risk: float = DEFAULT_CLASS_RISK,
) -> LifetimeEstimates:
    """What :class:`DistributionPredictor` answers, for VMs given by their features rather than a
    trace row: one batched model call, then the distribution conditioned on each uptime."""
    dist = model.predict_distribution(features, uptime_seconds)
    return LifetimeEstimates(
        dist.expected_remaining(uptime_seconds), risk_classes(dist, uptime_seconds, class_risk)
    )


class LifetimePredictor(Protocol):
    name: str
    # False when repredicting at a later uptime never changes a VM's predicted exit time.
    repredicts: bool

    def remaining(self, rows: Int64Array, uptime_seconds: FloatArray) -> FloatArray:
        """Predicted remaining lifetimes (seconds) of the VMs in ``rows`` at the given uptimes."""
        ...


class ModelPredictor:
    """The LightGBM model over the trace's features."""

    name = "model"
    repredicts = True

    def __init__(self, model: LifetimeModel, trace: VmTrace) -> None:
        self.model = model
        self.features = vm_features(trace)
        self.calls = 0
        self.predictions = 0

    def remaining(self, rows: Int64Array, uptime_seconds: FloatArray) -> FloatArray:
        rows = np.asarray(rows, dtype=np.int64)
        self.calls += 1
        self.predictions += int(rows.size)
        if rows.size <= SMALL_BATCH and self.model.has_fast_single_row:
            # A few VMs: LightGBM's single-row path per VM beats one batch call's fixed overhead.
            uptimes = np.broadcast_to(np.asarray(uptime_seconds, dtype=np.float64), rows.shape)
            return np.array(
                [
                    self.model.predict_remaining_one(self.features[r], u)
                    for r, u in zip(rows.tolist(), uptimes.tolist(), strict=True)
                ],
                dtype=np.float64,
            )
        return self.model.predict_remaining(self.features[rows], uptime_seconds)


class DistributionPredictor:
    """The lifetime distribution model (§3): one model call per VM, repredictions by conditioning.

    Each VM's lifetime distribution is computed from its creation-time features (what
    the scheduler knows when the VM is created) and kept; a reprediction conditions it
    on the uptime (Bayes, no model call; an uptime-aware model is also run at the latest
    grid uptime the VM reached, see :class:`DistributionModel`). ``remaining`` is E[T_r | T_u] (§3), which LAS
    and LA-Binary use. ``lifetime_classes`` gives LAVA its class (§4.3) from the whole
    distribution: the shortest class the VM outlives with probability at most
    ``class_risk``. The mean of a mixture falls between its modes (Figure 2); the risk
    class instead turns "probably short, possibly a day" into a class the VM is unlikely
    to outgrow, so LAVA's mispredictions become overpredictions, which its recycling
    hosts absorb (§4.3), rather than underpredictions, which extend hosts.
    """

    name = "model"
    repredicts = True

    def __init__(
        self,
        model: DistributionModel,
        trace: VmTrace,
        class_risk: float = DEFAULT_CLASS_RISK,
        exit_quantile: float | None = None,
    ) -> None:
        if not 0.0 < class_risk < 1.0:
            raise ValueError("class_risk must be in (0, 1)")
        if exit_quantile is not None and not 0.0 < exit_quantile < 1.0:
            raise ValueError("exit_quantile must be in (0, 1)")
        self.model = model
        self.class_risk = class_risk
        self.exit_quantile = exit_quantile
        self.features = vm_features(trace)
        # Creation-time features only: the batch call equals one call per VM at its creation.
        # An uptime-aware model is also run at each grid uptime (for all VMs, once, when first
        # needed); a VM's answer at uptime u uses the latest grid uptime <= u, which the VM has
        # reached, so nothing later than the VM's creation + u is used.
        self._by_grid: dict[int, FloatArray] = {0: model.predict_distribution(self.features).probs}
        self.calls = 0
        self.predictions = 0

    @property
    def distributions(self) -> LifetimeDistribution:
        """Every VM's lifetime distribution at creation."""
        return LifetimeDistribution(self._by_grid[0])

    def distribution(self, rows: Int64Array, uptime_seconds: npt.ArrayLike) -> LifetimeDistribution:
        """The VMs' lifetime distributions as known at their uptimes (condition on the same uptimes)."""
        rows = np.asarray(rows, dtype=np.int64)
        grid = self.model.grid_index(
            np.broadcast_to(np.asarray(uptime_seconds, dtype=np.float64), rows.shape)
        )
        probs = np.empty((rows.size, self._by_grid[0].shape[1]))
        for k in np.unique(grid).tolist():
            if k not in self._by_grid:
                assert self.model.uptime_grid is not None
                at = float(self.model.uptime_grid[k])
                self._by_grid[k] = self.model.predict_distribution(self.features, at).probs
            pick = grid == k
            probs[pick] = self._by_grid[k][rows[pick]]
        return LifetimeDistribution(probs)

    def remaining(self, rows: Int64Array, uptime_seconds: FloatArray) -> FloatArray:
        rows = np.asarray(rows, dtype=np.int64)
        self.calls += 1
        self.predictions += int(rows.size)
        dist = self.distribution(rows, uptime_seconds)
        if self.exit_quantile is not None:
            return dist.quantile(self.exit_quantile, uptime_seconds)
        return dist.expected_remaining(uptime_seconds)

    def lifetime_classes(self, rows: Int64Array, uptime_seconds: FloatArray) -> Int64Array:
        return risk_classes(self.distribution(rows, uptime_seconds), uptime_seconds, self.class_risk)


class OraclePredictor:
    """The true remaining lifetime, from the trace's deletion times."""

    name = "oracle"
    repredicts = False

    def __init__(self, trace: VmTrace) -> None:
        self.lifetime = trace.lifetime

    def remaining(self, rows: Int64Array, uptime_seconds: FloatArray) -> FloatArray:
        return np.maximum(self.lifetime[np.asarray(rows, dtype=np.int64)] - uptime_seconds, 0.0)
