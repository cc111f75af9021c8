"""Accuracy metrics (LAVA §3, §6.4, §6.5 Figure 9), checked against hand counts and brute force."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cellpilot.lifetimes.accuracy import (
    SEVEN_DAYS,
    classification_scores,
    f1_by_uptime_quantile,
    long_lived_scores,
    precision_at_recall,
)

DAY = 86400.0


@pytest.mark.parametrize(
    ("predicted", "actual", "precision", "recall"),
    [
        ([1, 1, 0, 0], [1, 0, 1, 0], 0.5, 0.5),
        ([1, 1, 1, 0], [1, 1, 1, 1], 1.0, 0.75),
        ([0, 0, 0, 0], [1, 0, 0, 0], 0.0, 0.0),
        ([1, 0, 0, 0], [0, 0, 0, 0], 0.0, 0.0),
    ],
    ids=["half", "perfect-precision", "no-predictions", "no-positives"],
)
def test_classification_scores_by_hand(
    predicted: list[int], actual: list[int], precision: float, recall: float
) -> None:
    s = classification_scores(np.array(predicted, bool), np.array(actual, bool))
    assert (s.precision, s.recall) == (precision, recall)
    expected_f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    assert s.f1 == pytest.approx(expected_f1)


def test_long_lived_split_at_seven_days() -> None:
    predicted = np.array([8, 8, 1, 6.99]) * DAY
    actual = np.array([10, 2, 9, 7.0]) * DAY  # exactly 7 days counts as long
    s = long_lived_scores(predicted, actual)
    assert (s.positives, s.predicted_positives) == (3, 2)
    assert (s.precision, s.recall) == (0.5, pytest.approx(1 / 3))


def brute_force_precision_at_recall(pred: np.ndarray, life: np.ndarray, recall: float) -> float:
    actual = life >= SEVEN_DAYS
    best = 0.0
    for threshold in sorted(set(pred.tolist()) | {np.inf}):
        s = classification_scores(pred >= threshold, actual)
        if s.recall >= recall - 1e-12:
            best = max(best, s.precision)
    return best


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20)), min_size=1, max_size=30),
    st.sampled_from([0.3, 0.5, 0.7, 1.0]),
)
def test_precision_at_recall_matches_brute_force(pairs: list[tuple[int, int]], recall: float) -> None:
    pred = np.array([p for p, _ in pairs], dtype=float) * DAY
    life = np.array([t for _, t in pairs], dtype=float) * DAY
    if not np.any(life >= SEVEN_DAYS):
        assert precision_at_recall(pred, life, recall) == (0.0, 0.0)
        return
    # Distinct thresholds on ties: the ranking version may split ties, so it can only do as well
    # or better than thresholds; with distinct scores both agree.
    pred = pred + np.arange(pred.size) * 1e-3
    got, got_recall = precision_at_recall(pred, life, recall)
    assert got == pytest.approx(brute_force_precision_at_recall(pred, life, recall))
    assert got_recall >= recall - 1e-12


class Exact:
    """A model that knows every lifetime: remaining = L - uptime."""

    def __init__(self, life: np.ndarray) -> None:
        self.life = life

    def predict_remaining(self, features: np.ndarray, uptime_seconds: object) -> np.ndarray:
        return self.life - np.asarray(uptime_seconds)


class Constant:
    def __init__(self, value: float) -> None:
        self.value = value

    def predict_remaining(self, features: np.ndarray, uptime_seconds: object) -> np.ndarray:
        return np.full(features.shape[0], self.value)


def test_f1_by_uptime_quantile() -> None:
    life = np.array([1.0, 3.0, 8.0, 20.0]) * DAY
    x = np.zeros((4, 8))
    np.testing.assert_allclose(f1_by_uptime_quantile(Exact(life), x, life, quantiles=5), np.ones(5))
    # Always "1 day left": predicted total = q/4 * L + 1 day; long-lived (>= 7 days) iff that reaches 7.
    f1 = f1_by_uptime_quantile(Constant(DAY), x, life, quantiles=4)
    # q=0: none predicted long -> 0. q=1: 20/4+1=6 -> none. q=2: 8/2+1=5 no, 20/2+1=11 yes -> P=1,R=1/2.
    # q=3: 8*3/4+1=7 yes, 20*3/4+1=16 yes, 3*3/4+1 no -> perfect.
    np.testing.assert_allclose(f1, [0.0, 0.0, 2 / 3, 1.0])
