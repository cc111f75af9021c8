"""The Kubernetes HPA baseline of the horizontal study: the replica calculator (ratio, tolerance,
not-ready and unmetered pods), stabilisation windows, scaling policies, min/max replicas and
the 15 s sync period, as the Kubernetes HPA controller documents them."""

from __future__ import annotations

import pytest

from cellpilot.evaluate.hpa import (
    DEFAULT_SCALE_DOWN,
    DEFAULT_SCALE_UP,
    HpaConfig,
    HpaPolicy,
    HpaRules,
    HpaState,
    hpa_recommendation,
    hpa_step,
)

CONFIG = HpaConfig(target_utilisation=0.5)
REQUEST = 1000.0


def at(utilisation: float, pods: int) -> float:
    """The summed usage of ``pods`` pods at ``utilisation`` of their request."""
    return utilisation * pods * REQUEST


@pytest.mark.parametrize(
    ("current", "ready", "usage", "expected"),
    [
        (4, 4, at(0.5, 4), 4),  # exactly at target
        (4, 4, at(0.55, 4), 4),  # ratio 1.1: within the tolerance
        (4, 4, at(0.45, 4), 4),  # ratio 0.9: within the tolerance
        (4, 4, at(0.56, 4), 5),  # ratio 1.12: ceil(4 x 1.12) = 5
        (4, 4, at(1.0, 4), 8),  # twice the target: double
        (10, 10, at(0.2, 10), 4),  # ratio 0.4: ceil(10 x 0.4)
        (3, 0, 0.0, 3),  # no ready pod, no metrics: no action
        (6, 4, at(0.6, 4), 6),  # 2 not ready at 0 %: ratio 0.8 reverses the scale-up
        (6, 4, at(1.0, 4), 8),  # 2 not ready at 0 %: 4000 / 6000 / 0.5 = 1.33 -> 8
        (10, 6, at(0.25, 6), 3),  # scale-down: the 4 not ready are set aside, ceil(6 x 0.5)
    ],
    ids=["at-target", "tol-high", "tol-low", "up", "double", "down", "no-metrics", "not-ready-reverses",
         "not-ready-dampens", "not-ready-aside"],
)  # fmt: skip
def test_recommendation_is_ceil_of_pods_times_ratio_outside_the_tolerance(
    current: int, ready: int, usage: float, expected: int
) -> None:
    assert hpa_recommendation(CONFIG, current, ready, usage, REQUEST) == expected


@pytest.mark.parametrize(
    ("current", "ready", "unmetered", "usage", "expected"),
    [
        # scale-down: 8 measured at 20 % (ratio 0.4, alone 4 pods); 2 unmetered at 100 % of
        # their request: 3600 / 10000 / 0.5 = 0.72 -> ceil(7.2) = 8
        (10, 8, 2, at(0.2, 8), 8),
        # scale-down reversed: 2 at 20 % and 2 unmetered at 100 %: ratio 1.2 -> no action
        (4, 2, 2, at(0.2, 2), 4),
        # scale-up: 2 at 100 % (ratio 2), 1 unmetered at 0 %: 2000 / 3000 / 0.5 = 1.33 -> 4
        (3, 2, 1, at(1.0, 2), 4),
        # scale-up into the tolerance: 2 at 100 %, 2 unmetered at 0 %: ratio 1.0 -> no action
        (4, 2, 2, at(1.0, 2), 4),
        # scale-up: 2 at 100 %, 1 unmetered and 1 not ready at 0 %: ratio 1.0 -> no action
        (4, 2, 1, at(1.0, 2), 4),
    ],
    ids=["down-at-100pct", "down-reversed", "up-at-0pct", "up-within-tolerance", "up-with-not-ready"],
)
def test_a_ready_pod_without_a_metric_counts_at_100pct_down_and_0pct_up(
    current: int, ready: int, unmetered: int, usage: float, expected: int
) -> None:
    assert hpa_recommendation(CONFIG, current, ready, usage, REQUEST, unmetered) == expected


def step(
    config: HpaConfig, state: HpaState, current: int, utilisation: float, now_s: float
) -> tuple[HpaState, int]:
    """A sync on ``current`` ready pods all at ``utilisation`` of their request."""
    return hpa_step(config, state, current, current, at(utilisation, current), REQUEST, now_s)


@pytest.mark.parametrize(
    ("current", "utilisation", "expected"),
    [
        (2, 5.0, 6),  # wants 20: at most max(2 x 2, 2 + 4) = 6 in one 15 s period
        (10, 1.5, 20),  # wants 30: at most max(20, 14)
        (10, 0.6, 12),  # wants 12: within the limits
    ],
)
def test_default_scale_up_is_the_larger_of_100pct_or_4_pods_per_15s(
    current: int, utilisation: float, expected: int
) -> None:
    assert CONFIG.scale_up == DEFAULT_SCALE_UP
    _, target = step(CONFIG, HpaState(), current, utilisation, 0.0)
    assert target == expected


def test_syncs_of_one_call_see_the_pods_they_added_as_not_ready() -> None:
    start, _ = step(CONFIG, HpaState(), 2, 0.5, 0.0)
    # 2 measured pods at 500 % (20 wanted), the pods each sync added not ready (0 %): 2 -> 6
    # (the policy) -> 12 (the policy; 10000 / 6000 / 0.5 wants 20) -> 20 -> 20 (ratio 1).
    state, counts, current = start, [], 2
    for now in (15.0, 30.0, 45.0, 60.0):
        state, current = hpa_step(CONFIG, state, current, 2, at(5.0, 2), REQUEST, now)
        counts.append(current)
    assert counts == [6, 12, 20, 20]
    # One call at 60 s runs the same four syncs on the same metrics.
    _, target = hpa_step(CONFIG, start, 2, 2, at(5.0, 2), REQUEST, 60.0)
    assert target == 20
    # Twice the target on 2 pods: 2 -> 4, then the 2 new pods at 0 % bring the ratio to 1.
    _, target = hpa_step(CONFIG, start, 2, 2, at(1.0, 2), REQUEST, 60.0)
    assert target == 4


def test_default_scale_down_allows_100pct_per_15s() -> None:
    assert CONFIG.scale_down == DEFAULT_SCALE_DOWN
    state, _ = step(CONFIG, HpaState(), 40, 0.5, 0.0)
    state, target = step(CONFIG, state, 40, 0.05, 300.0)  # seed out of the window: 40 -> 4
    assert target == 4


SLOW = HpaRules(0.0, (HpaPolicy("pods", 4, 60),))


@pytest.mark.parametrize(
    ("rules", "current", "expected"),
    [
        (SLOW, 2, 6),
        (HpaRules(0.0, (HpaPolicy("percent", 50, 15),)), 10, 15),
        (HpaRules(0.0, (HpaPolicy("percent", 100, 15), HpaPolicy("pods", 4, 15)), "min"), 10, 14),
        (HpaRules(0.0, (HpaPolicy("percent", 100, 15), HpaPolicy("pods", 4, 15)), "max"), 10, 20),
        (HpaRules(0.0, (), "disabled"), 10, 10),
    ],
    ids=["pods", "percent", "select-min", "select-max", "disabled"],
)
def test_configurable_scale_up_policies(rules: HpaRules, current: int, expected: int) -> None:
    config = HpaConfig(0.5, scale_up=rules)
    _, target = step(config, HpaState(), current, 5.0, 0.0)  # wants 10 x current
    assert target == expected


def test_a_policy_counts_the_changes_of_its_whole_period() -> None:
    config = HpaConfig(0.5, scale_up=SLOW)  # 4 pods per 60 s
    state, target = step(config, HpaState(), 2, 5.0, 0.0)
    assert target == 6
    for now in (15.0, 30.0, 45.0):  # the 4 pods added at 0 s still count: no more
        state, target = step(config, state, 6, 5.0, now)
        assert target == 6
    state, target = step(config, state, 6, 5.0, 60.0)  # the period is over: 4 more
    assert target == 10


def test_configurable_scale_down_policy() -> None:
    config = HpaConfig(0.5, scale_down=HpaRules(0.0, (HpaPolicy("pods", 1, 60),)))
    state, target = step(config, HpaState(), 10, 0.5, 0.0)
    counts = []
    for now in range(15, 181, 15):
        state, target = step(config, state, target, 0.05, float(now))
        counts.append(target)
    # window 0: the seed leaves at once; then 1 pod per minute
    assert counts == [9, 9, 9, 9, 8, 8, 8, 8, 7, 7, 7, 7]


def test_scale_up_stabilisation_window_takes_the_lowest_recommendation() -> None:
    config = HpaConfig(0.5, scale_up=replace_window(DEFAULT_SCALE_UP, 60.0))
    state, target = step(config, HpaState(), 4, 1.0, 0.0)  # the seed 4 is in the window
    assert target == 4
    state, target = step(config, state, 4, 1.0, 15.0)
    assert target == 4
    state, target = step(config, state, 4, 0.75, 30.0)  # recommends 6
    state, target = step(config, state, 4, 1.0, 45.0)
    assert target == 4
    state, target = step(config, state, 4, 1.0, 60.0)  # window (0, 60]: 8, 6, 8, 8 -> 6
    assert target == 6


def replace_window(rules: HpaRules, window_s: float) -> HpaRules:
    return HpaRules(window_s, rules.policies, rules.select)


def test_nothing_scales_down_in_the_first_five_minutes() -> None:
    # The controller first sees the job at 100 s with 10 pods and almost no load (wants 1).
    state, target = step(CONFIG, HpaState(), 10, 0.05, 100.0)
    assert target == 10
    for now in (160.0, 280.0, 385.0):
        state, target = step(CONFIG, state, 10, 0.05, now)
        assert target == 10
    state, target = step(CONFIG, state, 10, 0.05, 400.0)  # the seed has left the window
    assert target == 1


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
    state, _ = step(CONFIG, HpaState(), 10, 0.5, 0.0)  # seeds 10, recommends 10
    state, target = step(CONFIG, state, 12, 0.05, 15.0)  # recommends 2; the window's max is 10
    assert target == 10
    assert [r for _, r in state.recent] == [10, 10, 2]


@pytest.mark.parametrize(
    ("current", "utilisation", "min_replicas", "max_replicas", "expected"),
    [
        (4, 5.0, 1, 6, 6),  # wants 40, the policy allows 8, max 6
        (12, 0.5, 1, 8, 8),  # above max: straight to max
        (1, 0.5, 3, None, 3),  # below min: straight to min
        (12, 0.0, 1, 8, 8),  # above max: straight to max, whatever the seeded window holds
    ],
    ids=["max-caps-up", "above-max", "below-min", "above-max-idle"],
)
def test_min_and_max_replicas(
    current: int, utilisation: float, min_replicas: int, max_replicas: int | None, expected: int
) -> None:
    config = HpaConfig(0.5, min_replicas=min_replicas, max_replicas=max_replicas)
    _, target = step(config, HpaState(), current, utilisation, 0.0)
    assert target == expected


def test_min_replicas_floors_a_scale_down() -> None:
    config = HpaConfig(0.5, min_replicas=3)
    state, _ = step(config, HpaState(), 10, 0.5, 0.0)
    _, target = step(config, state, 10, 0.05, 300.0)  # wants 1
    assert target == 3


def test_the_controller_syncs_every_15_seconds() -> None:
    state, target = step(CONFIG, HpaState(), 4, 0.5, 0.0)
    assert (target, state.last_sync_s) == (4, 0.0)
    # 10 s later no sync is due: nothing changes, however high the load.
    later, target = step(CONFIG, state, 4, 1.0, 10.0)
    assert (target, later) == (4, state)
    state, target = step(CONFIG, state, 4, 1.0, 15.0)
    assert (target, state.last_sync_s) == (8, 15.0)
    # A call 50 s on runs the three syncs due (30, 45, 60 s), not a fourth at 65 s.
    state, _ = step(CONFIG, state, 8, 0.5, 65.0)
    assert state.last_sync_s == 60.0
    assert [t for t, _ in state.recent][-3:] == [30.0, 45.0, 60.0]


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="target utilisation"):
        HpaConfig(target_utilisation=0.0)
    with pytest.raises(ValueError, match="tolerance"):
        HpaConfig(target_utilisation=0.5, tolerance=1.5)
    with pytest.raises(ValueError, match="max replicas"):
        HpaConfig(0.5, min_replicas=4, max_replicas=2)
    with pytest.raises(ValueError, match="policy kind"):
        HpaPolicy("cores", 1, 15)
    with pytest.raises(ValueError, match="at least one scaling policy"):
        HpaRules(0.0, ())
    with pytest.raises(ValueError, match="stabilisation window"):
        HpaRules(-1.0, DEFAULT_SCALE_UP.policies)
