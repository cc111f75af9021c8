"""The master's vertical step in array form: bounds with their reason, the dead band, held jobs."""

from __future__ import annotations

import numpy as np
import pytest

from cellpilot.autopilot.vertical_targets import (
    CLAMP_REASONS,
    ClampReason,
    bound_limits,
    chosen_values,
    significant_changes,
    vertical_targets,
)

NAN = float("nan")


@pytest.mark.parametrize(
    ("value", "lower", "upper", "machine", "expected", "reason"),
    [
        (5.0, None, None, None, 5.0, ClampReason.NONE),
        (5.0, 6.0, None, None, 6.0, ClampReason.MIN_BOUND),
        (5.0, None, 4.0, None, 4.0, ClampReason.MAX_BOUND),
        (5.0, 1.0, 9.0, None, 5.0, ClampReason.NONE),
        (5.0, NAN, 4.0, None, 4.0, ClampReason.MAX_BOUND),
        (9.0, None, None, 8.0, 8.0, ClampReason.MACHINE_SIZE),
        (NAN, 1.0, 9.0, None, NAN, ClampReason.NONE),
    ],
    ids=[
        "no-bounds",
        "raised",
        "cut",
        "inside",
        "nan-lower-means-none",
        "largest-machine",
        "no-recommendation",
    ],
)
def test_bounds_clamp_and_say_why(
    value: float,
    lower: float | None,
    upper: float | None,
    machine: float | None,
    expected: float,
    reason: ClampReason,
) -> None:
    out, why = bound_limits(np.array([value]), lower, upper, machine)
    assert float(out[0]) == pytest.approx(expected, nan_ok=True)
    assert CLAMP_REASONS[int(why[0])] is reason


def test_inverted_bounds_are_a_configuration_error() -> None:
    with pytest.raises(ValueError, match="min_limit"):
        bound_limits(np.array([1.0]), np.array([5.0]), np.array([4.0]))


@pytest.mark.parametrize(
    ("current", "target", "significant"),
    [
        (1000.0, 1005.0, False),
        (1000.0, 1010.0, True),
        (1000.0, 960.0, False),
        (1000.0, 950.0, True),
        (0.0, 5.0, True),
        (0.0, 0.0, False),
    ],
    ids=["small-up", "up", "small-down", "down", "from-nothing", "nothing"],
)
def test_dead_band(current: float, target: float, significant: bool) -> None:
    assert significant_changes([current], [target], 0.01, 0.05).tolist() == [significant]


def test_a_batch_decides_each_job_on_its_own() -> None:
    values = np.array([[100.0, 200.0], [300.0, 400.0], [500.0, 600.0], [NAN, NAN]])
    raised = np.array([[False, True], [False, False], [False, False], [False, False]])
    chosen, by_hour = chosen_values(values, raised, [1, 0, -1, 0])
    assert chosen[:2].tolist() == [200.0, 300.0]
    assert np.isnan(chosen[2:]).all()
    assert by_hour.tolist() == [True, False, False, False]
    targets = vertical_targets(
        chosen,
        by_hour,
        current=[150.0, 299.0, 400.0, 700.0],
        on=[True, True, True, False],
        held=[False, False, True, False],
        max_limit=[NAN, NAN, 350.0, NAN],
    )
    # job 0: ON, raised by the last hour's max; job 1: inside the dead band; job 2: held with
    # no recommendation starts from its own limit, cut by its bound; job 3: nothing yet.
    assert targets.value[:3].tolist() == [200.0, 300.0, 350.0]
    assert np.isnan(targets.value[3])
    assert [CLAMP_REASONS[c] for c in targets.clamp] == [
        ClampReason.LAST_HOUR_MAX,
        ClampReason.NONE,
        ClampReason.MAX_BOUND,
        ClampReason.NONE,
    ]
    assert targets.actuate.tolist() == [True, False, True, False]
