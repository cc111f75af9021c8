"""Lifetime *distributions* and their conditioning on uptime (LAVA §2.1 Figure 2, §3).

§3 models a VM's lifetime as a probability distribution rather than a single value:
one feature vector maps to a narrow distribution for a predictable VM and a wide or
multi-modal one otherwise, and "given a VM has been running for T_u, what is the
expected remaining lifetime T_r?" is "directly calculated from the PDF". Here the
distribution is discrete over lifetime bins (:data:`BIN_EDGES`, log-spaced, with
LAVA's class boundaries 1, 10, 100 and 1000 h among the edges) and log-uniform inside
each bin, so everything conditional on the uptime has a closed form:

* the survival function S(t) = P(L > t), piecewise;
* E[T_r | T_u = u] = E[(L - u)+] / S(u) (§3's reprediction quantity);
* P(T_r in LAVA class c | T_u = u) (§4.3's classes of the remaining lifetime);
* quantiles of T_r given T_u (for coverage checks and risk-aware decisions).

Conditioning the creation-time distribution on L > u is Bayes' rule, so one model
call per VM (at creation) serves every later reprediction: repredicting costs a few
array operations, not a model run (§3's "option 1, materialize a mapping from uptime
to the expected remaining lifetime", which a distribution makes cheap).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from cellpilot.array_types import FloatArray, Int64Array

HOUR = 3600.0
# Lifetime bin edges (hours): 0.1 s .. 366 days. LAVA's class bounds 1, 10, 100, 1000 h are edges.
# The sub-minute bins are for Borg tasks, which can end within seconds (Borg §2.1's batch jobs);
# a trace without such lifetimes leaves them empty, and a model trained on it gives them ~0 mass.
BIN_EDGES_HOURS: tuple[float, ...] = (
    0.1 / 3600, 1 / 3600, 10 / 3600,
    1 / 60, 10 / 60, 0.5, 1.0, 2.0, 4.0, 10.0, 24.0, 48.0, 100.0, 250.0, 1000.0, 8784.0,
)  # fmt: skip
BIN_EDGES = np.asarray(BIN_EDGES_HOURS) * HOUR
NUM_BINS = BIN_EDGES.size - 1
_LOG_EDGES = np.log(BIN_EDGES)
_LOG_WIDTH = np.diff(_LOG_EDGES)
# Mean of a log-uniform variable on each bin: (b - a) / ln(b / a).
_BIN_MEANS = np.diff(BIN_EDGES) / _LOG_WIDTH


def lifetime_bin(lifetime_seconds: npt.ArrayLike) -> Int64Array:
    """Bin index of lifetimes; below the first edge goes to bin 0, beyond the last to the top bin."""
    life = np.asarray(lifetime_seconds, dtype=np.float64)
    return np.clip(np.searchsorted(BIN_EDGES, life, side="right") - 1, 0, NUM_BINS - 1).astype(np.int64)


def _survival(probs: FloatArray, t: FloatArray) -> FloatArray:
    """S(t) = P(L > t) per row of ``probs`` (n, NUM_BINS) at times ``t`` (n,)."""
    t = np.clip(t, BIN_EDGES[0], BIN_EDGES[-1])
    j = np.clip(np.searchsorted(BIN_EDGES, t, side="right") - 1, 0, NUM_BINS - 1)
    above = np.cumsum(probs[:, ::-1], axis=1)[:, ::-1]  # above[:, k] = sum of bins k..
    rows = np.arange(probs.shape[0])
    later = np.where(j + 1 < NUM_BINS, above[rows, np.minimum(j + 1, NUM_BINS - 1)], 0.0)
    inside = probs[rows, j] * (_LOG_EDGES[j + 1] - np.log(t)) / _LOG_WIDTH[j]
    return np.asarray(later + np.maximum(inside, 0.0), dtype=np.float64)


class LifetimeDistribution:
    """Per-VM discrete lifetime distributions (rows of bin probabilities) and their conditionals."""

    def __init__(self, probs: npt.ArrayLike) -> None:
        p = np.atleast_2d(np.asarray(probs, dtype=np.float64))
        if p.shape[1] != NUM_BINS:
            raise ValueError(f"expected {NUM_BINS} bin probabilities per row, got {p.shape[1]}")
        if np.any(p < 0):
            raise ValueError("bin probabilities must be >= 0")
        total = p.sum(axis=1, keepdims=True)
        if np.any(total <= 0):
            raise ValueError("every row needs some probability mass")
        self.probs = p / total

    def __len__(self) -> int:
        return int(self.probs.shape[0])

    def take(self, rows: npt.ArrayLike) -> LifetimeDistribution:
        out = LifetimeDistribution.__new__(LifetimeDistribution)
        out.probs = self.probs[np.asarray(rows, dtype=np.int64)]
        return out

    def _uptime(self, uptime_seconds: npt.ArrayLike) -> FloatArray:
        return np.broadcast_to(np.asarray(uptime_seconds, dtype=np.float64), (len(self),)).copy()

    def survival(self, t_seconds: npt.ArrayLike, uptime_seconds: npt.ArrayLike = 0.0) -> FloatArray:
        """P(T_r > t | T_u = uptime) per row (1 where the uptime is past all the mass)."""
        u = self._uptime(uptime_seconds)
        t = np.broadcast_to(np.asarray(t_seconds, dtype=np.float64), u.shape)
        alive = _survival(self.probs, u)
        later = _survival(self.probs, u + t)
        return np.where(alive > 1e-12, np.minimum(later / np.maximum(alive, 1e-300), 1.0), 1.0)

    def expected_remaining(self, uptime_seconds: npt.ArrayLike = 0.0) -> FloatArray:
        """E[T_r | T_u = uptime] in seconds (§3). Past the last bin edge: the uptime itself."""
        u = self._uptime(uptime_seconds)
        uc = np.clip(u, BIN_EDGES[0], BIN_EDGES[-1])
        lo, hi = BIN_EDGES[:-1][None, :], BIN_EDGES[1:][None, :]
        ucol = uc[:, None]
        # E[(L - u)+ | bin]: whole bin above u, u inside the bin, or bin below u.
        full = _BIN_MEANS[None, :] - ucol
        part = ((hi - ucol) - ucol * np.log(hi / ucol)) / _LOG_WIDTH[None, :]
        per_bin = np.where(lo >= ucol, full, np.where(hi > ucol, part, 0.0))
        excess = np.sum(self.probs * per_bin, axis=1)
        alive = _survival(self.probs, uc)
        mean = np.where(alive > 1e-12, excess / np.maximum(alive, 1e-300), u)
        return np.asarray(np.maximum(mean + (uc - u).clip(min=0.0), 0.0), dtype=np.float64)

    def class_probabilities(
        self, upper_seconds: npt.ArrayLike, uptime_seconds: npt.ArrayLike = 0.0
    ) -> FloatArray:
        """(n, C) P(T_r in class c | T_u): classes end at ``upper_seconds`` (the last one is open)."""
        bounds = np.asarray(upper_seconds, dtype=np.float64)
        u = self._uptime(uptime_seconds)
        surv = np.column_stack([np.ones(len(self))] + [self.survival(b, u) for b in bounds[:-1]])
        nxt = np.column_stack([surv[:, 1:], np.zeros(len(self))])
        return np.asarray(np.clip(surv - nxt, 0.0, 1.0), dtype=np.float64)

    def quantile(self, q: float, uptime_seconds: npt.ArrayLike = 0.0) -> FloatArray:
        """The ``q``-quantile of T_r given T_u, in seconds (closed form: invert S inside one bin)."""
        if not 0.0 < q < 1.0:
            raise ValueError("q must be in (0, 1)")
        u = self._uptime(uptime_seconds)
        uc = np.clip(u, BIN_EDGES[0], BIN_EDGES[-1])
        target = (1.0 - q) * _survival(self.probs, uc)  # S(u + x) = (1 - q) S(u)
        above = np.cumsum(self.probs[:, ::-1], axis=1)[:, ::-1]  # S at each bin's lower edge
        at_edges = np.column_stack([above, np.zeros(len(self))])  # (n, NUM_BINS + 1)
        # The bin k whose survival range [S(b_{k+1}), S(b_k)) holds the target.
        k = np.clip(np.sum(at_edges[:, 1:] >= target[:, None], axis=1), 0, NUM_BINS - 1)
        rows = np.arange(len(self))
        p = np.maximum(self.probs[rows, k], 1e-300)
        log_t = _LOG_EDGES[k + 1] - (target - at_edges[rows, k + 1]) * _LOG_WIDTH[k] / p
        t = np.clip(np.exp(log_t), BIN_EDGES[0], BIN_EDGES[-1])  # exact at the edges (no exp round-off)
        return np.asarray(np.maximum(t, uc) - np.minimum(u, uc), dtype=np.float64)
