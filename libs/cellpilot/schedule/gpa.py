"""Stochastic bin packing with the Gaussian Percentile Approximation (GPA §4).

A machine's total instantaneous CPU usage is approximated by a Gaussian whose mean
and variance are the sums of its tasks' means and variances (GPA §3.6, §4). Task k
fits machine j iff the probability that the new total exceeds the capacity c stays
at most rho: F(c | mu_j + mu_k, var_j + var_k) >= 1 - rho (Algorithm 1). With
z = F^-1(1 - rho) of the standard normal this is mu' + z sigma' <= c, which needs no
erf per candidate.

Packing is First Fit or Best Fit. Best Fit picks the bin with the smallest
non-negative FitBin = rho - P(overflow) (§4), i.e. the bin closest to its overflow
budget; we rank by the standardised headroom (c - mu') / sigma', which orders bins
identically (P(overflow) is decreasing in it) without underflow ties, and break
ties (e.g. bins of zero variance) by the capacity left.

After packing, the round-robin rebalancing of §4 moves the first task of machines
1..m-1 to the (usually underloaded) last machine until ``max_failures`` moves fail.

The §5.1 baselines pack deterministic item sizes with the same algorithms:
``av`` (f times the mean), ``perc`` (the p-th percentile of observed usage) and
``Cantelli`` (mean plus b standard deviations).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import numpy.typing as npt

from cellpilot.array_types import FloatArray, IntpArray

ALGORITHMS = ("first-fit", "best-fit")


def gaussian_z(rho: float) -> float:
    """z with P(N(0, 1) > z) = rho."""
    if not 0.0 < rho < 1.0:
        raise ValueError(f"overflow probability must be in (0, 1), got {rho}")
    return NormalDist().inv_cdf(1.0 - rho)


def gaussian_fits(
    mean_sum: npt.ArrayLike,
    var_sum: npt.ArrayLike,
    task_mean: float,
    task_var: float,
    capacity: npt.ArrayLike,
    rho: float,
) -> npt.NDArray[np.bool_]:
    """GPA fit test (Algorithm 1, FitBin >= 0) for many machines at once."""
    mean = np.asarray(mean_sum, dtype=np.float64) + task_mean
    sigma = np.sqrt(np.asarray(var_sum, dtype=np.float64) + task_var)
    return np.asarray(mean + gaussian_z(rho) * sigma <= np.asarray(capacity, dtype=np.float64) + 1e-12)


def overflow_probability(mean: npt.ArrayLike, var: npt.ArrayLike, capacity: npt.ArrayLike) -> FloatArray:
    """1 - F(c | mean, var): the Gaussian estimate of the probability of exceeding ``capacity``."""
    m, v, c = np.broadcast_arrays(
        np.asarray(mean, dtype=np.float64),
        np.asarray(var, dtype=np.float64),
        np.asarray(capacity, dtype=np.float64),
    )
    out = np.empty(m.shape)
    for i, (mi, vi, ci) in enumerate(zip(m.ravel(), v.ravel(), c.ravel(), strict=True)):
        if vi <= 0:
            out.flat[i] = 1.0 if mi > ci else 0.0
        else:
            out.flat[i] = 0.5 * math.erfc((ci - mi) / math.sqrt(2.0 * vi))
    return out


@dataclass(frozen=True)
class Packing:
    assignment: IntpArray  # bin of each item, 0..bins-1
    bins: int  # bins (machines) holding at least one item

    def members(self) -> list[IntpArray]:
        order = np.argsort(self.assignment, kind="stable")
        cuts = np.searchsorted(self.assignment[order], np.arange(1, self.bins))
        return list(np.split(order, cuts))


class _Bins:
    """Per-bin sums for either deterministic sizes (var = 0) or Gaussian items."""

    def __init__(self, n: int, capacity: float, z: float | None) -> None:
        self.mean = np.zeros(n)
        self.var = np.zeros(n)
        self.open = 0
        self.capacity = capacity
        self.z = z  # None: deterministic sizes

    def fit_keys(
        self, mean: float, var: float, bins: slice | int
    ) -> tuple[FloatArray, FloatArray, npt.NDArray[np.bool_]]:
        """(headroom, left, fits) for ``bins``.

        Best fit takes, among fitting bins, the smallest standardised headroom, then the
        least capacity left (which alone decides for deterministic sizes).
        """
        m = np.atleast_1d(self.mean[bins] + mean)
        left = self.capacity - m
        if self.z is None:
            return np.zeros_like(left), left, left >= -1e-12
        sigma = np.sqrt(np.atleast_1d(self.var[bins] + var))
        fits = m + self.z * sigma <= self.capacity + 1e-12
        with np.errstate(divide="ignore", invalid="ignore"):
            headroom = np.where(sigma > 0, left / sigma, np.inf)
        return headroom, left, fits

    def add(self, b: int, mean: float, var: float) -> None:
        self.mean[b] += mean
        self.var[b] += var


def pack(
    means: npt.ArrayLike,
    variances: npt.ArrayLike | None = None,
    *,
    capacity: float = 1.0,
    rho: float | None = None,
    algorithm: str = "best-fit",
    rebalance: bool = True,
    max_failures: int = 5,
) -> Packing:
    """Packs items in the given order.

    With ``rho`` set, items are Gaussian (``means``, ``variances``) and the GPA fit test
    is used; without it ``means`` are deterministic sizes (the §5.1 baselines). An item
    that fits no open bin opens a new one, even if it exceeds the capacity alone.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    mu = np.asarray(means, dtype=np.float64)
    var = np.zeros_like(mu) if variances is None or rho is None else np.asarray(variances, dtype=np.float64)
    n = mu.size
    bins = _Bins(max(n, 1), capacity, None if rho is None else gaussian_z(rho))
    assignment = np.empty(n, dtype=np.intp)
    first_fit = algorithm == "first-fit"
    for i in range(n):
        chosen = -1
        if bins.open:
            headroom, left, fits = bins.fit_keys(mu[i], var[i], slice(0, bins.open))
            candidates = np.flatnonzero(fits)
            if candidates.size:
                if first_fit:
                    chosen = int(candidates[0])
                else:
                    best = np.lexsort((candidates, left[candidates], headroom[candidates]))[0]
                    chosen = int(candidates[best])
        if chosen < 0:
            chosen = bins.open
            bins.open += 1
        bins.add(chosen, mu[i], var[i])
        assignment[i] = chosen
    if rebalance and bins.open > 1:
        _rebalance(assignment, bins, mu, var, max_failures)
    used = np.unique(assignment)
    relabel = np.full(max(bins.open, 1), -1, dtype=np.intp)
    relabel[used] = np.arange(used.size)
    return Packing(relabel[assignment], int(used.size))


def _rebalance(
    assignment: IntpArray, bins: _Bins, mu: FloatArray, var: FloatArray, max_failures: int
) -> None:
    """Round-robin over machines 1..m-1: move each one's first task to the last machine (§4)."""
    last = bins.open - 1
    queues: list[list[int]] = [[] for _ in range(bins.open)]
    for item, b in enumerate(assignment.tolist()):
        queues[b].append(item)
    failures = 0
    turn = 0
    while failures < max_failures:
        source = turn % last
        turn += 1
        if not queues[source]:
            failures += 1
            continue
        item = queues[source][0]
        _, _, fits = bins.fit_keys(mu[item], var[item], last)
        if not fits[0]:
            failures += 1
            continue
        queues[source].pop(0)
        queues[last].append(item)
        bins.add(source, -mu[item], -var[item])
        bins.add(last, mu[item], var[item])
        assignment[item] = last


def size_av(mean: npt.ArrayLike, factor: float) -> FloatArray:
    """§5.1 av: item size = factor * mean observed usage."""
    return float(factor) * np.asarray(mean, dtype=np.float64)


def size_cantelli(mean: npt.ArrayLike, std: npt.ArrayLike, b: float) -> FloatArray:
    """§5.1 Cantelli: item size = mean + b * std (Pr[X > mu + b sigma] < 1 / (1 + b^2))."""
    return np.asarray(mean, dtype=np.float64) + float(b) * np.asarray(std, dtype=np.float64)


def size_percentile(samples: npt.ArrayLike, percentile: float) -> FloatArray:
    """§5.1 perc: item size = the given percentile of each task's observed usage (rows)."""
    return np.percentile(np.asarray(samples, dtype=np.float64), percentile, axis=1)
