"""Uptime expansion of training examples (LAVA §3): VM seen at 0, 12.5 %, 25 %, ... of its lifetime."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cellpilot.lifetimes.features import NUM_FEATURES
from cellpilot.lifetimes.training_examples import UPTIME_FRACTIONS, expand_examples


def features(n: int) -> np.ndarray:
    return np.arange(n * NUM_FEATURES, dtype=np.float64).reshape(n, NUM_FEATURES)


def test_fractions_are_the_papers_eighths() -> None:
    assert UPTIME_FRACTIONS == (0.0, 0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875)


def test_one_vm_expanded_by_hand() -> None:
    lifetime = 8 * 3600.0  # 8 h: uptimes 0, 1 h, ..., 7 h; remaining 8 h, 7 h, ..., 1 h
    inputs, remaining, rows = expand_examples(features(1), np.array([lifetime]))
    assert inputs.shape == (8, NUM_FEATURES + 1)
    np.testing.assert_allclose(inputs[:, -1], np.arange(8.0))  # uptime column, hours
    np.testing.assert_allclose(remaining, (8.0 - np.arange(8.0)) * 3600.0)
    np.testing.assert_array_equal(rows, np.zeros(8))
    np.testing.assert_array_equal(inputs[:, :NUM_FEATURES], np.tile(features(1), (8, 1)))


def test_layout_is_fraction_major() -> None:
    _, remaining, rows = expand_examples(features(3), np.array([100.0, 200.0, 300.0]), (0.0, 0.5))
    np.testing.assert_array_equal(rows, [0, 1, 2, 0, 1, 2])
    np.testing.assert_allclose(remaining, [100.0, 200.0, 300.0, 50.0, 100.0, 150.0])


@pytest.mark.parametrize(
    "fractions", [(), (1.0,), (-0.1,), (0.0, 1.5)], ids=["empty", "one", "negative", "above-one"]
)
def test_rejects_fractions_outside_unit_interval(fractions: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match="fractions"):
        expand_examples(features(1), np.array([10.0]), fractions)


def test_rejects_mismatched_rows_and_negative_lifetimes() -> None:
    with pytest.raises(ValueError, match="same number"):
        expand_examples(features(2), np.array([1.0]))
    with pytest.raises(ValueError, match=">= 0"):
        expand_examples(features(1), np.array([-1.0]))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(min_value=0.0, max_value=1e7), min_size=1, max_size=20))
def test_uptime_plus_remaining_is_the_lifetime(lifetimes: list[float]) -> None:
    life = np.array(lifetimes)
    inputs, remaining, rows = expand_examples(features(life.size), life)
    assert np.all(remaining >= 0)
    np.testing.assert_allclose(inputs[:, -1] * 3600.0 + remaining, life[rows], rtol=1e-9, atol=1e-6)
