"""Lifetime distributions and their conditioning on uptime (LAVA §2.1 Figure 2, §3), and calibration."""

from __future__ import annotations

import numpy as np
import pytest

from cellpilot.lifetimes.calibration import (
    calibration_report,
    class_scores,
    expected_calibration_error,
    reliability_table,
)
from cellpilot.lifetimes.distribution import BIN_EDGES, NUM_BINS, LifetimeDistribution, lifetime_bin
from cellpilot.lifetimes.lifetime_classes import LIFETIME_CLASS_UPPER, lifetime_class

HOUR = 3600.0


def sample(probs: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """Lifetimes drawn from one row of bin probabilities, log-uniform inside each bin."""
    k = rng.choice(NUM_BINS, size=n, p=probs)
    lo, hi = np.log(BIN_EDGES[k]), np.log(BIN_EDGES[k + 1])
    return np.exp(lo + rng.random(n) * (hi - lo))


def one_bin(hours: float) -> np.ndarray:
    p = np.zeros(NUM_BINS)
    p[lifetime_bin(hours * HOUR)] = 1.0
    return p


def test_class_bounds_are_bin_edges() -> None:
    for upper in LIFETIME_CLASS_UPPER:
        assert np.any(np.isclose(BIN_EDGES, upper))


@pytest.mark.parametrize("uptime_h", [0.0, 0.3, 2.0, 30.0, 400.0])
def test_closed_forms_match_sampling(uptime_h: float) -> None:
    rng = np.random.default_rng(1)
    probs = rng.random(NUM_BINS) ** 2
    probs /= probs.sum()
    life = sample(probs, 400_000, rng)
    u = uptime_h * HOUR
    alive = life[life > u] - u
    d = LifetimeDistribution(probs)
    assert d.expected_remaining(u)[0] == pytest.approx(alive.mean(), rel=0.03)
    for q in (0.1, 0.5, 0.9):
        assert np.mean(alive <= d.quantile(q, u)[0]) == pytest.approx(q, abs=0.01)
    for t in (0.5, 5.0, 50.0):
        assert d.survival(t * HOUR, u)[0] == pytest.approx(np.mean(alive > t * HOUR), abs=0.01)
    classes = d.class_probabilities(LIFETIME_CLASS_UPPER, u)[0]
    observed = np.bincount(lifetime_class(alive), minlength=4) / alive.size
    np.testing.assert_allclose(classes, observed, atol=0.01)
    assert classes.sum() == pytest.approx(1.0)


def test_figure_2_a_bimodal_vm_expects_the_long_mode_once_the_short_one_has_passed() -> None:
    # Half the mass around 0.5 h, half around 150 h: at creation the mean sits between the
    # modes; after 2 h of uptime only the long mode is left (§3 item 2).
    d = LifetimeDistribution(0.5 * one_bin(0.5) + 0.5 * one_bin(150.0))
    at_creation, after_2h = d.take([0, 0]).expected_remaining(np.array([0.0, 2.0 * HOUR]))
    assert 20 * HOUR < at_creation < 120 * HOUR
    assert after_2h > 100 * HOUR
    short, _, _, long = d.class_probabilities(LIFETIME_CLASS_UPPER, 0.0)[0]
    assert (short, long) == (pytest.approx(0.5), pytest.approx(0.5))
    assert d.class_probabilities(LIFETIME_CLASS_UPPER, 2.0 * HOUR)[0][2:].sum() == pytest.approx(1.0)


def test_past_all_mass_the_remaining_lifetime_is_the_uptime() -> None:
    d = LifetimeDistribution(one_bin(0.05))
    assert d.expected_remaining(9000.0 * HOUR)[0] == pytest.approx(9000.0 * HOUR)
    assert d.survival(HOUR, 9000.0 * HOUR)[0] == 1.0


@pytest.mark.parametrize(
    "probs",
    [np.ones(NUM_BINS - 1), -np.ones(NUM_BINS), np.zeros(NUM_BINS)],
    ids=["bins", "negative", "no-mass"],
)
def test_bad_distributions_are_rejected(probs: np.ndarray) -> None:
    with pytest.raises(ValueError):
        LifetimeDistribution(probs)


def test_ece_is_zero_when_calibrated_and_grows_with_overconfidence() -> None:
    rng = np.random.default_rng(2)
    p = rng.random(20_000)
    truth = (rng.random(20_000) < p).astype(np.int64)  # class 1 with probability p
    calibrated = np.column_stack([1 - p, p])
    overconfident = np.column_stack([1 - np.round(p), np.round(p)])
    assert expected_calibration_error(calibrated, truth) < 0.03
    assert expected_calibration_error(overconfident, truth) > 0.3
    rows = reliability_table(calibrated, truth, 1)
    assert all(abs(r["predicted"] - r["observed"]) < 0.05 for r in rows)
    assert class_scores(calibrated, truth)["brier"] < class_scores(overconfident, truth)["brier"]


def test_calibration_report_of_the_true_distribution_covers_its_quantiles() -> None:
    rng = np.random.default_rng(3)
    probs = rng.random(NUM_BINS)
    probs /= probs.sum()
    life = sample(probs, 50_000, rng)
    d = LifetimeDistribution(np.tile(probs, (life.size, 1)))
    report = calibration_report(d, None, life, LIFETIME_CLASS_UPPER, lifetime_class)
    assert [r["uptime_hours"] for r in report] == [0.0, 1.0, 10.0, 100.0]
    for row in report:
        assert row["coverage_q0.5"] == pytest.approx(0.5, abs=0.02)
        assert row["coverage_q0.9"] == pytest.approx(0.9, abs=0.02)
        assert row["ece"] < 0.05
    # A point model's predicted class is scored as a one-hot distribution (no quantiles).
    point = calibration_report(None, lambda rows, u: np.full(rows.size, 0.5 * HOUR), life,
                               LIFETIME_CLASS_UPPER, lifetime_class)  # fmt: skip
    assert "coverage_q0.5" not in point[0]
    assert point[0]["accuracy"] == pytest.approx(np.mean(life < HOUR), abs=1e-9)
