"""Calibration of predicted lifetime distributions (LAVA §3: distributions, not point estimates).

A distribution is only useful for decisions if its probabilities mean what they say.
Measured on VMs the model never saw, at several uptimes (a reprediction at uptime u
is scored on the VMs still alive at u, against their true remaining lifetime):

* **Reliability of LAVA class probabilities** (§4.3 classes of the remaining
  lifetime): predictions of P(class c) are grouped in ten probability bins; the
  expected calibration error (ECE) is the VM-weighted mean gap between a bin's mean
  predicted probability and the observed share of VMs in class c, summed over the
  classes. The multi-class Brier score and the accuracy of the most probable class go
  with it.
* **Quantile coverage**: the share of VMs whose remaining lifetime is at most the
  predicted q-quantile, for q = 0.1, 0.5, 0.9 (calibrated: about q).

A point model gets the same table with its predicted class as a one-hot
"distribution" (no quantiles), so before/after numbers line up.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from cellpilot.array_types import FloatArray, Int64Array
from cellpilot.lifetimes.distribution import LifetimeDistribution

HOUR = 3600.0
UPTIMES_HOURS: tuple[float, ...] = (0.0, 1.0, 10.0, 100.0)
COVERAGE_QUANTILES: tuple[float, ...] = (0.1, 0.5, 0.9)
RELIABILITY_BINS = 10


def expected_calibration_error(probs: FloatArray, true_class: Int64Array) -> float:
    """Sum over classes of the VM-weighted |mean predicted - observed| over ten probability bins."""
    probs = np.asarray(probs, dtype=np.float64)
    n, classes = probs.shape
    if n == 0:
        return 0.0
    total = 0.0
    for c in range(classes):
        p = probs[:, c]
        hit = (true_class == c).astype(np.float64)
        bins = np.minimum((p * RELIABILITY_BINS).astype(np.int64), RELIABILITY_BINS - 1)
        mean_p = np.bincount(bins, weights=p, minlength=RELIABILITY_BINS)
        mean_hit = np.bincount(bins, weights=hit, minlength=RELIABILITY_BINS)
        total += float(np.sum(np.abs(mean_p - mean_hit))) / n
    return total


def reliability_table(probs: FloatArray, true_class: Int64Array, klass: int) -> list[dict[str, float]]:
    """Rows (bin, mean predicted, observed share, VMs) of class ``klass``'s reliability diagram."""
    p = np.asarray(probs, dtype=np.float64)[:, klass]
    hit = (np.asarray(true_class) == klass).astype(np.float64)
    bins = np.minimum((p * RELIABILITY_BINS).astype(np.int64), RELIABILITY_BINS - 1)
    rows = []
    for b in range(RELIABILITY_BINS):
        inside = bins == b
        if inside.any():
            rows.append(
                {
                    "bin": b / RELIABILITY_BINS,
                    "predicted": float(p[inside].mean()),
                    "observed": float(hit[inside].mean()),
                    "vms": float(inside.sum()),
                }
            )
    return rows


def class_scores(probs: FloatArray, true_class: Int64Array) -> dict[str, float]:
    probs = np.asarray(probs, dtype=np.float64)
    onehot = np.eye(probs.shape[1])[true_class]
    return {
        "ece": expected_calibration_error(probs, true_class),
        "brier": float(np.mean(np.sum((probs - onehot) ** 2, axis=1))) if probs.size else 0.0,
        "accuracy": float(np.mean(np.argmax(probs, axis=1) == true_class)) if probs.size else 0.0,
    }


def calibration_report(
    distribution: LifetimeDistribution | Callable[[Int64Array, float], LifetimeDistribution] | None,
    point_remaining: Any,
    lifetimes: FloatArray,
    class_upper: FloatArray,
    class_of: Any,
) -> list[dict[str, Any]]:
    """One row per uptime in :data:`UPTIMES_HOURS` over the VMs alive then.

    ``distribution``: the VMs' creation-time distributions, or ``distribution(rows, uptime)``
    giving those of ``rows`` as known at ``uptime`` (an uptime-aware model), or None for a
    point model;
    ``point_remaining(rows, uptime)``: predicted remaining seconds (used when there is no
    distribution); ``class_of(seconds)``: LAVA class of remaining lifetimes.
    """
    lifetimes = np.asarray(lifetimes, dtype=np.float64)
    out = []
    for hours in UPTIMES_HOURS:
        u = hours * HOUR
        rows = np.flatnonzero(lifetimes > u)
        if rows.size == 0:
            continue
        true_class = np.asarray(class_of(lifetimes[rows] - u), dtype=np.int64)
        row: dict[str, Any] = {"uptime_hours": hours, "vms": int(rows.size)}
        if distribution is not None:
            if isinstance(distribution, LifetimeDistribution):
                sub = distribution.take(rows)
            else:
                sub = distribution(rows, u)
            probs = sub.class_probabilities(class_upper, u)
            for q in COVERAGE_QUANTILES:
                row[f"coverage_q{q:g}"] = float(np.mean(lifetimes[rows] - u <= sub.quantile(q, u)))
        else:
            predicted = np.asarray(class_of(point_remaining(rows, u)), dtype=np.int64)
            probs = np.eye(len(class_upper))[predicted]
        row.update(class_scores(probs, true_class))
        out.append(row)
    return out
