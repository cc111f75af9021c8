"""Where a placement policy gets remaining lifetimes: the learned model or an oracle (LAVA §6.1).

A predictor is bound to one trace: VMs are named by their row in it, and the caller
passes each VM's current uptime. The model predictor is what runs in production
(§3); the oracle knows every VM's true deletion time and gives the "perfect
(oracular) predictor" comparison point of §6.1.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import numpy.typing as npt

from cellpilot.lifetimes.distribution import LifetimeDistribution
from cellpilot.lifetimes.distribution_model import DistributionModel
from cellpilot.lifetimes.features import vm_features
from cellpilot.lifetimes.model import LifetimeModel
from cellpilot.schedule.lifetime_aware.lifetime_scores import LIFETIME_CLASS_UPPER
from cellpilot.workloads.vm_trace import VmTrace

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

SMALL_BATCH = 16  # up to this many VMs, predict one by one (see ModelPredictor.remaining)


class LifetimePredictor(Protocol):
    name: str
    # False when repredicting at a later uptime never changes a VM's predicted exit time.
    repredicts: bool

    def remaining(self, rows: IntArray, uptime_seconds: FloatArray) -> FloatArray:
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

    def remaining(self, rows: IntArray, uptime_seconds: FloatArray) -> FloatArray:
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
    on the uptime (Bayes, no model call). ``remaining`` is E[T_r | T_u] (§3), which LAS
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
        class_risk: float = 0.05,
        exit_quantile: float | None = None,
    ) -> None:
        if not 0.0 < class_risk < 1.0:
            raise ValueError("class_risk must be in (0, 1)")
        if exit_quantile is not None and not 0.0 < exit_quantile < 1.0:
            raise ValueError("exit_quantile must be in (0, 1)")
        self.model = model
        self.class_risk = class_risk
        self.exit_quantile = exit_quantile
        # Creation-time features only: the batch call equals one call per VM at its creation.
        self.distributions: LifetimeDistribution = model.predict_distribution(vm_features(trace))
        self.calls = 0
        self.predictions = 0

    def remaining(self, rows: IntArray, uptime_seconds: FloatArray) -> FloatArray:
        rows = np.asarray(rows, dtype=np.int64)
        self.calls += 1
        self.predictions += int(rows.size)
        dist = self.distributions.take(rows)
        if self.exit_quantile is not None:
            return dist.quantile(self.exit_quantile, uptime_seconds)
        return dist.expected_remaining(uptime_seconds)

    def lifetime_classes(self, rows: IntArray, uptime_seconds: FloatArray) -> IntArray:
        dist = self.distributions.take(np.asarray(rows, dtype=np.int64))
        survive = np.column_stack(
            [dist.survival(upper, uptime_seconds) for upper in LIFETIME_CLASS_UPPER[:-1]]
        )
        return np.asarray(np.sum(survive > self.class_risk, axis=1), dtype=np.int64)


class OraclePredictor:
    """The true remaining lifetime, from the trace's deletion times."""

    name = "oracle"
    repredicts = False

    def __init__(self, trace: VmTrace) -> None:
        self.lifetime = trace.lifetime

    def remaining(self, rows: IntArray, uptime_seconds: FloatArray) -> FloatArray:
        return np.maximum(self.lifetime[np.asarray(rows, dtype=np.int64)] - uptime_seconds, 0.0)
