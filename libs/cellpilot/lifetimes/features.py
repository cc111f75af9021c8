"""Model inputs for a VM: what is known when it is created, plus its uptime so far (LAVA §3).

§3 lists the features LAVA uses (zone, VM family, shape, local SSD, internal metadata);
ours are the shape (cores, memory, SSD), the workload category, the owner, the zone,
the tier and the hour of day of creation. The uptime is the extra input that turns a
regression model into a survival model (§3): it is always the last column.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from cellpilot.array_types import FloatArray
from cellpilot.lifetimes.vm_table import DAY, HOUR, VmTrace

FEATURE_NAMES: tuple[str, ...] = (
    "cores",
    "memory_gib",
    "ssd_gib",
    "category",
    "owner",
    "zone",
    "tier",
    "created_hour",
)
CATEGORICAL: tuple[str, ...] = ("category", "owner", "zone", "tier")
UPTIME = "uptime_hours"
MODEL_INPUTS: tuple[str, ...] = (*FEATURE_NAMES, UPTIME)
NUM_FEATURES = len(FEATURE_NAMES)


def vm_features(trace: VmTrace) -> FloatArray:
    """(n, NUM_FEATURES) creation-time features of every VM of ``trace``, in FEATURE_NAMES order."""
    hour = np.mod(trace.created, DAY) / HOUR
    return np.column_stack(
        [
            trace.cores,
            trace.memory_gib,
            trace.ssd_gib,
            trace.category.astype(np.float64),
            trace.owner.astype(np.float64),
            trace.zone.astype(np.float64),
            trace.tier.astype(np.float64),
            np.floor(hour),
        ]
    ).astype(np.float64)


def model_inputs(features: FloatArray, uptime_seconds: npt.ArrayLike) -> FloatArray:
    """Appends the uptime (in hours) as the last column: the model's input matrix."""
    features = np.atleast_2d(np.asarray(features, dtype=np.float64))
    if features.shape[1] != NUM_FEATURES:
        raise ValueError(f"expected {NUM_FEATURES} feature columns, got {features.shape[1]}")
    uptime = np.broadcast_to(np.asarray(uptime_seconds, dtype=np.float64) / HOUR, (features.shape[0],))
    out = np.empty((features.shape[0], NUM_FEATURES + 1))
    out[:, :NUM_FEATURES] = features
    out[:, NUM_FEATURES] = uptime
    return out
