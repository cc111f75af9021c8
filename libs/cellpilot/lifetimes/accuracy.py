"""Accuracy of lifetime predictions as LAVA reports it (§3, §6.4, §6.5 Figure 9).

* Short/long classification at 7 days: a VM is predicted long-lived when its
  predicted total lifetime (uptime + predicted remaining lifetime) reaches the
  threshold; precision and recall are those of the long class (§3 reports 99 %
  precision at 70 % recall; :func:`precision_at_recall` finds that operating point by
  moving the decision threshold).
* Figure 9: the same F1 score with the uptime input set to the q-th of 20 quantiles
  of each VM's lifetime (uptime = q/20 x lifetime), showing how repredictions with a
  longer observed uptime become more accurate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from cellpilot.array_types import BoolArray, FloatArray
from cellpilot.lifetimes.vm_table import DAY

SEVEN_DAYS = 7.0 * DAY


class RemainingModel(Protocol):
    def predict_remaining(self, features: FloatArray, uptime_seconds: npt.ArrayLike) -> FloatArray: ...


@dataclass(frozen=True)
class SplitScores:
    precision: float
    recall: float
    f1: float
    positives: int  # truly long-lived VMs
    predicted_positives: int


def classification_scores(predicted: BoolArray, actual: BoolArray) -> SplitScores:
    """Precision, recall and F1 of the positive class (0 where undefined)."""
    predicted = np.asarray(predicted, dtype=bool)
    actual = np.asarray(actual, dtype=bool)
    tp = int(np.sum(predicted & actual))
    p = int(predicted.sum())
    a = int(actual.sum())
    precision = tp / p if p else 0.0
    recall = tp / a if a else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
    return SplitScores(precision, recall, f1, a, p)


def long_lived_scores(
    predicted_lifetime: FloatArray, true_lifetime: FloatArray, threshold: float = SEVEN_DAYS
) -> SplitScores:
    """Scores of "lives at least ``threshold`` seconds" from predicted total lifetimes."""
    return classification_scores(
        np.asarray(predicted_lifetime) >= threshold, np.asarray(true_lifetime) >= threshold
    )


def precision_at_recall(
    predicted_lifetime: FloatArray, true_lifetime: FloatArray, recall: float, threshold: float = SEVEN_DAYS
) -> tuple[float, float]:
    """Best precision (and its recall) of the long class over decision thresholds with recall >= ``recall``.

    VMs are ranked by predicted lifetime; predicting the top k as long-lived gives one
    (precision, recall) point per k. Returns (0, 0) when no VM is long-lived.
    """
    actual = np.asarray(true_lifetime) >= threshold
    positives = int(actual.sum())
    if positives == 0:
        return 0.0, 0.0
    order = np.argsort(-np.asarray(predicted_lifetime), kind="stable")
    hits = np.cumsum(actual[order])
    k = np.arange(1, actual.size + 1)
    precisions = hits / k
    recalls = hits / positives
    ok = recalls >= recall - 1e-12
    best = int(np.argmax(np.where(ok, precisions, -1.0)))
    return float(precisions[best]), float(recalls[best])


def f1_by_uptime_quantile(
    model: RemainingModel,
    features: FloatArray,
    lifetimes: FloatArray,
    quantiles: int = 20,
    threshold: float = SEVEN_DAYS,
) -> FloatArray:
    """Figure 9: F1 of the long class when each VM's uptime is q/``quantiles`` of its lifetime."""
    lifetimes = np.asarray(lifetimes, dtype=np.float64)
    actual = lifetimes >= threshold
    out = np.zeros(quantiles)
    for q in range(quantiles):
        uptime = lifetimes * (q / quantiles)
        predicted = uptime + model.predict_remaining(features, uptime)
        out[q] = classification_scores(predicted >= threshold, actual).f1
    return out
