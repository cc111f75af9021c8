"""The Kubernetes HPA rule of the horizontal study: ratio, tolerance, not-ready pods, scale-down window."""

from __future__ import annotations

import pytest

from cellpilot.evaluate.hpa import HpaConfig, HpaState, hpa_recommendation, hpa_step

CONFIG = HpaConfig(target_utilisation=0.5)
REQUEST = 1000.0


@pytest.mark.parametrize(
    ("current", "ready", "usage", "expected"),
    [
        (4, 4, 4 * 500.0, 4),  # exactly at target
        (4, 4, 4 * 550.0, 4),  # ratio 1.1: within the tolerance
        (4, 4, 4 * 450.0, 4),  # ratio 0.9: within the tolerance
        (4, 4, 4 * 560.0, 5),  # ratio 1.12: ceil(4 x 1.12) = 5
        (4, 4, 4 * 1000.0, 8),  # twice the target: double
        (10, 10, 10 * 200.0, 4),  # ratio 0.4: ceil(10 x 0.4)
        (3, 0, 0.0, 3),  # no ready pod, no metrics: no action
    ],
)
def test_recommendation_is_ceil_of_current_times_ratio_outside_the_tolerance(
    current: int, ready: int, usage: float, expected: int
) -> None:
    assert hpa_recommendation(CONFIG, current, ready, usage, REQUEST) == expected


def test_not_ready_pods_count_as_idle_when_scaling_up() -> None:
    # 4 ready pods at 60 % (ratio 1.2) would give 5; with 2 more not ready counted at 0 % the
    # ratio is 0.8: it reverses the direction, so no action.
    assert hpa_recommendation(CONFIG, 6, 4, 4 * 600.0, REQUEST) == 6
    # 4 ready at 100 %, 2 not ready: ratio 4000 / 6000 / 0.5 = 1.33 -> ceil(1.33 x 6) = 8.
    assert hpa_recommendation(CONFIG, 6, 4, 4 * 1000.0, REQUEST) == 8


def test_scale_down_waits_for_the_highest_recommendation_of_the_last_five_minutes() -> None:
    state = HpaState()
    state, target = hpa_step(CONFIG, state, 8, 8, 8 * 1000.0, REQUEST, 0.0)  # up to 16 at once
    assert target == 16
    # Load falls: the rule recommends 4, but 16 was recommended less than 5 minutes ago.
    state, target = hpa_step(CONFIG, state, 16, 16, 16 * 125.0, REQUEST, 60.0)
    assert target == 16
    state, target = hpa_step(CONFIG, state, 16, 16, 16 * 125.0, REQUEST, 299.0)
    assert target == 16
    # 300 s after the 16: only the recent 4s remain in the window.
    state, target = hpa_step(CONFIG, state, 16, 16, 16 * 125.0, REQUEST, 300.0)
    assert target == 4


def test_scale_down_takes_the_window_max_not_the_current_count() -> None:
    state = HpaState(((0.0, 10),))
    state, target = hpa_step(CONFIG, state, 12, 12, 12 * 100.0, REQUEST, 60.0)  # recommends 3
    assert target == 10  # the highest of the window (10), below the current 12
    assert [r for _, r in state.recent] == [10, 3]


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="target utilisation"):
        HpaConfig(target_utilisation=0.0)
    with pytest.raises(ValueError, match="tolerance"):
        HpaConfig(target_utilisation=0.5, tolerance=1.5)
