"""LAVA lifetime classes (§4.3): predicted remaining lifetimes binned <1 h, 1-10 h, 10-100 h and
100-1000 h (LC1..LC4 as 0..3; longer predictions stay in the top class).

The classes belong to the prediction, not to a placement policy: the predictors report them,
the Borgmaster shows a pending task's class, and LAVA's placement (:mod:`cellpilot.schedule.lifetime_aware`)
reads them.
"""

from __future__ import annotations

import numpy as np

from cellpilot.array_types import FloatArray, Int64Array
from cellpilot.lifetimes.vm_table import HOUR

LIFETIME_CLASS_UPPER = np.array([1.0, 10.0, 100.0, 1000.0]) * HOUR  # §4.3: LC1..LC4
NUM_LIFETIME_CLASSES = LIFETIME_CLASS_UPPER.size


def lifetime_class(remaining_seconds: float | FloatArray) -> Int64Array:
    """LAVA lifetime class (§4.3) of predicted remaining lifetimes: 0 (<1 h) .. 3 (>= 100 h)."""
    r = np.asarray(remaining_seconds, dtype=np.float64)
    return np.minimum(
        np.searchsorted(LIFETIME_CLASS_UPPER, r, side="right"), NUM_LIFETIME_CLASSES - 1
    ).astype(np.int64)


def class_upper(lifetime_class_index: int) -> float:
    """Longest lifetime (seconds) of a class; classes below LC1 have none left (0)."""
    if lifetime_class_index < 0:
        return 0.0
    return float(LIFETIME_CLASS_UPPER[min(lifetime_class_index, NUM_LIFETIME_CLASSES - 1)])
