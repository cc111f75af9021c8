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

from cellpilot.lifetimes.features import vm_features
from cellpilot.lifetimes.model import LifetimeModel
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


class OraclePredictor:
    """The true remaining lifetime, from the trace's deletion times."""

    name = "oracle"
    repredicts = False

    def __init__(self, trace: VmTrace) -> None:
        self.lifetime = trace.lifetime

    def remaining(self, rows: IntArray, uptime_seconds: FloatArray) -> FloatArray:
        return np.maximum(self.lifetime[np.asarray(rows, dtype=np.int64)] - uptime_seconds, 0.0)
