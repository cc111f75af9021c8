"""GPA (GPA §4): the Gaussian fit test against Monte Carlo, First/Best Fit, rebalancing, baselines."""

from __future__ import annotations

from statistics import NormalDist

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cellpilot.schedule import gaussian_fits, overflow_probability, pack
from cellpilot.schedule.gpa import size_av, size_cantelli, size_percentile


def monte_carlo_overflow(samples: np.ndarray, capacity: float) -> float:
    """Brute force: the share of draws of the machine total above the capacity."""
    return float(np.mean(samples.sum(axis=0) > capacity))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("rho", [0.1, 0.05, 0.01], ids=["0.1", "0.05", "0.01"])
def test_fit_test_agrees_with_monte_carlo_for_gaussian_tasks(seed: int, rho: float) -> None:
    rng = np.random.default_rng(seed)
    k = int(rng.integers(3, 30))
    means = rng.uniform(0.005, 0.06, k)
    stds = rng.uniform(0.002, 0.04, k)
    draws = rng.normal(means[:, None], stds[:, None], (k, 200_000))
    capacity = float(means.sum() + rng.uniform(0.5, 3.0) * np.sqrt((stds**2).sum()))
    p = monte_carlo_overflow(draws, capacity)
    # The machine holds k - 1 tasks; the fit test asks about adding the last one.
    fits = bool(
        gaussian_fits(means[:-1].sum(), (stds[:-1] ** 2).sum(), means[-1], stds[-1] ** 2, capacity, rho)
    )
    if p < 0.8 * rho:
        assert fits, (p, rho)
    elif p > 1.2 * rho:
        assert not fits, (p, rho)
    assert float(overflow_probability(means.sum(), (stds**2).sum(), capacity)) == pytest.approx(p, abs=0.004)


@pytest.mark.parametrize("shape", ["uniform", "exponential", "bimodal"])
def test_gaussian_estimate_of_many_non_gaussian_tasks(shape: str) -> None:
    """GPA §3.6: with tens of tasks the Gaussian estimate of the overflow probability is close."""
    rng = np.random.default_rng(42)
    k, n = 40, 200_000
    if shape == "uniform":
        draws = rng.uniform(0.0, 0.05, (k, n))
    elif shape == "exponential":
        draws = rng.exponential(0.025, (k, n))
    else:
        draws = np.where(rng.random((k, n)) < 0.3, 0.06, 0.01) * rng.uniform(0.9, 1.1, (k, n))
    means, variances = draws.mean(axis=1), draws.var(axis=1)
    capacity = float(means.sum() + 1.28 * np.sqrt(variances.sum()))  # about the 90th percentile
    estimate = float(overflow_probability(means.sum(), variances.sum(), capacity))
    assert estimate == pytest.approx(monte_carlo_overflow(draws, capacity), abs=0.015)


def test_overflow_probability_matches_the_normal_cdf() -> None:
    for mean, var, cap in [(0.5, 0.01, 0.7), (0.9, 0.04, 1.0), (0.2, 0.0, 1.0), (1.2, 0.0, 1.0)]:
        expected = (1.0 if mean > cap else 0.0) if var == 0 else 1 - NormalDist(mean, var**0.5).cdf(cap)
        assert float(overflow_probability(mean, var, cap)) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(
    ("sizes", "algorithm", "rebalance", "assignment", "bins"),
    [
        ([0.5, 0.7, 0.3, 0.2], "first-fit", False, [0, 1, 0, 0], 2),
        ([0.5, 0.7, 0.3, 0.2], "best-fit", False, [0, 1, 1, 0], 2),
        # Rebalancing moves machine 0's first task to the last machine while it fits.
        ([0.4, 0.4, 0.4, 0.1], "first-fit", True, [1, 0, 1, 0], 2),
        ([0.4, 0.4, 0.4, 0.1], "first-fit", False, [0, 0, 1, 0], 2),
        # An item larger than a machine still gets a machine of its own.
        ([1.5, 0.2], "best-fit", False, [0, 1], 2),
        ([], "best-fit", True, [], 0),
    ],
    ids=["first-fit", "best-fit", "rebalanced", "not-rebalanced", "oversized", "empty"],
)
def test_deterministic_packing(
    sizes: list[float], algorithm: str, rebalance: bool, assignment: list[int], bins: int
) -> None:
    packing = pack(sizes, algorithm=algorithm, rebalance=rebalance)
    assert packing.assignment.tolist() == assignment
    assert packing.bins == bins


def test_gaussian_packing_fills_bins_to_the_percentile() -> None:
    # Each item ~ (0.2, 0.1^2); rho = 0.05: 3 items give 0.6 + 1.645 * 0.1 * sqrt(3) <= 1, 4 do not.
    z = NormalDist().inv_cdf(0.95)
    per_bin = max(n for n in range(1, 10) if 0.2 * n + z * 0.1 * np.sqrt(n) <= 1.0)
    packing = pack([0.2] * 9, [0.01] * 9, rho=0.05, algorithm="first-fit", rebalance=False)
    assert per_bin == 3
    assert np.bincount(packing.assignment).tolist() == [per_bin] * 3


@pytest.mark.parametrize(
    ("algorithm", "expected"), [("best-fit", [0, 1, 1]), ("first-fit", [0, 1, 0])], ids=["best", "first"]
)
def test_best_fit_picks_the_bin_closest_to_its_overflow_budget(algorithm: str, expected: list[int]) -> None:
    # 0.5 and 0.6 cannot share a machine; 0.1 fits both, and the 0.6 machine is closer to overflowing
    # (headroom (1 - 0.7) / sqrt(0.002) < (1 - 0.6) / sqrt(0.002)).
    packing = pack([0.5, 0.6, 0.1], [0.001] * 3, rho=0.1, algorithm=algorithm, rebalance=False)
    assert packing.assignment.tolist() == expected


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0.0, 0.5), st.floats(0.0, 0.05)), min_size=1, max_size=60),
    st.sampled_from([0.1, 0.05, 0.01]),
    st.sampled_from(["first-fit", "best-fit"]),
    st.booleans(),
)
def test_every_packed_machine_passes_the_fit_test(
    items: list[tuple[float, float]], rho: float, algorithm: str, rebalance: bool
) -> None:
    means = np.array([m for m, _ in items])
    variances = np.array([s * s for _, s in items])
    packing = pack(means, variances, rho=rho, algorithm=algorithm, rebalance=rebalance)
    assert packing.assignment.shape == means.shape
    assert sorted(set(packing.assignment.tolist())) == list(range(packing.bins))
    z = NormalDist().inv_cdf(1 - rho)
    for b in range(packing.bins):
        members = packing.assignment == b
        if members.sum() > 1:
            assert means[members].sum() + z * np.sqrt(variances[members].sum()) <= 1.0 + 1e-9


def test_baseline_item_sizes() -> None:
    samples = np.array([[0.0, 0.1, 0.2, 0.3, 0.4], [1.0, 1.0, 1.0, 1.0, 1.0]])
    np.testing.assert_allclose(size_av([0.2, 1.0], 1.25), [0.25, 1.25])
    np.testing.assert_allclose(size_cantelli([0.2, 1.0], [0.1, 0.0], 1.7), [0.37, 1.0])
    np.testing.assert_allclose(size_percentile(samples, 50), [0.2, 1.0])
    np.testing.assert_allclose(size_percentile(samples, 100), [0.4, 1.0])
