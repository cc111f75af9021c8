"""Post-processing: the 10-15 % margin curve, the max over the last hour."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cellpilot.recommend.post_processing import (
    HOUR_MS,
    MINUTE_MS,
    MarginCurve,
    initial_window_max,
    update_window_max,
)
from cellpilot.usage.buckets import Resource

CURVE = MarginCurve(small_limit=1.0, large_limit=100.0)


@pytest.mark.parametrize(
    ("value", "margin"),
    [(0.01, 0.15), (1.0, 0.15), (10.0, 0.125), (100.0, 0.10), (1e6, 0.10)],
    ids=["tiny", "small-limit", "geometric-midpoint", "large-limit", "huge"],
)
def test_margin_is_15_percent_for_small_and_10_percent_for_large_limits(value: float, margin: float) -> None:
    assert float(CURVE.margin_for(value)) == pytest.approx(margin)


@pytest.mark.parametrize("resource", list(Resource), ids=lambda r: r.value)
def test_default_curves_stay_within_10_to_15_percent_and_keep_order(resource: Resource) -> None:
    curve = MarginCurve.for_resource(resource)
    values = np.geomspace(curve.small_limit / 100, curve.large_limit * 100, 200)
    margins = curve.margin_for(values)
    assert np.all((margins >= 0.10) & (margins <= 0.15))
    assert np.all(np.diff(margins) <= 0)  # smaller for larger limits
    raised, used = curve.apply(values)
    assert np.allclose(raised, values * (1 + margins))
    assert np.array_equal(used, margins)
    assert np.all(np.diff(raised) > 0)  # a larger raw value never gets a smaller limit


def test_nan_has_no_margin() -> None:
    assert np.isnan(CURVE.margin_for(float("nan")))


def run_hour_max(script: list[tuple[int, float]]) -> list[float]:
    state = initial_window_max(1, slots=12)
    out = []
    for t, value in script:
        state, window_max = update_window_max(state, np.array([value]), np.array([t]), 5 * MINUTE_MS)
        out.append(float(window_max[0]))
    return out


def test_max_over_the_last_hour_holds_a_peak_for_one_hour() -> None:
    five = 5 * MINUTE_MS
    script = [(0, 10.0)] + [(k * five, 5.0) for k in range(1, 14)]
    held = run_hour_max(script)
    assert held[:12] == [10.0] * 12  # t = 0 .. 55 min: the peak at t = 0 is within the hour
    assert held[12:] == [5.0, 5.0]  # t = 60 min: it has left the window


def test_max_keeps_the_highest_value_within_a_slot_and_forgets_after_silence() -> None:
    script = [(0, 3.0), (MINUTE_MS, 7.0), (2 * MINUTE_MS, 4.0), (3 * HOUR_MS, 1.0)]
    assert run_hour_max(script) == [3.0, 7.0, 7.0, 1.0]


def test_nan_values_are_not_recorded() -> None:
    out = run_hour_max([(0, float("nan")), (MINUTE_MS, 2.0), (2 * MINUTE_MS, float("nan"))])
    assert math.isnan(out[0])
    assert out[1:] == [2.0, 2.0]
