"""The ML recommender of Autopilot §3.2.3: an ensemble of arg-min models (eqs. 4-9).

Each model m has a decay rate d_m and a safety margin M_m. At every step it tests every
bucket boundary L as a limit: exponentially smoothed overrun o(L) and underrun u(L) counts
(eqs. 4-5), an arg-min with a penalty for changing its limit (eq. 6), plus its margin
(eq. 7). Each model keeps a decayed cost c_m (eq. 8) and the recommender picks the model
with the smallest cost plus penalties for switching model or limit (eq. 9).

State that scales. Eqs. 4-5 are linear in the histogram: with
H_d[t] = (1 - d) H_d[t-1] + d s[t] (the histogram smoothed at rate d),
o(L)[t] = sum_{j: b[j] > L} H_d[t][j] and u(L)[t] = sum_{j: b[j] < L} H_d[t][j] for every L,
when o, u and H start at zero. So a job keeps one smoothed histogram per *distinct* decay
rate (D x K floats) instead of two cost curves per model (2 x M x K): with the default 10
decay rates x 10 margins = 100 models and 400 buckets that is 32 KB per job and 320 MB for
10 000 jobs in float64, rather than 6.4 GB. Per model the state is just its previous raw
limit index and its cost. float64 is kept rather than float32: near-ties between limits
are decided at full precision, and on exactly representable inputs the decisions equal a
plain evaluation of the equations (the unit tests check this against a brute force).
Temporaries are bounded by processing jobs in chunks, so the benchmark's 10 000 jobs need
about 0.3 GB of state plus one copy for the updated state.

The arg-min of eq. 6 needs no per-model K-vector either: with the change penalty, the
answer is either the model's previous limit or the unpenalised arg-min for its decay rate
(whichever is cheaper, ties to the smaller index as ``argmin`` would). Per update and
job the work is O(D x K + M log K) ⊆ O(buckets x models).

Interpretation choices (documented where the paper is silent or circular):

* Eq. 9 penalises Delta(L[t], L_m[t]), which names the quantity being chosen; we compare
  with the previous final limit L[t-1], the reading that makes it a switching penalty.
* Before a model has a previous limit (its first step) there is no change penalty; before
  a previous model exists there is no model-switch penalty.
* The smoothing of eqs. 4, 5 and 8 advances one step per histogram (t counts windows, as
  in the paper), not per elapsed time; event times are only checked for order.

The defaults are eqs. 4-9 as written. Three deviations are named options, each measured in
the closed-loop replay (docs/results/autopilot-eval.md says which the shipped configuration
uses, and why):

* ``ModelGrid.margin_mode``: eq. 7 adds M_m (``MarginMode.ADDITIVE``, the default). The
  additive margins are multiples of ``ModelGrid.margin_unit``, the resource's own unit
  (one core of CPU, one GiB of memory: set per resource by the candidate configuration), so
  one grid, geometric from 1/128 to 2 units, spans jobs of every size.
  ``MarginMode.RELATIVE`` scales instead: L_m = L'_m (1 + M_m).
* ``EnsembleConfig.cost_at_previous_limit``: eq. 8 as written (``False``) scores L_m[t], a
  limit chosen after seeing s[t], against s[t]. ``True`` scores the limit that was in force
  during the window, L_m[t-1] (the first step, with no previous limit, uses L_m[t]): a
  model is then rewarded for predicting the window, not for fitting it.
* ``EnsembleConfig.normalise_histograms``: eqs. 4-5 count raw samples (``False``). ``True``
  divides each histogram by its sample count, so costs are fractions of samples and one set
  of weights suits jobs of any task count and sampling rate.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum
from itertools import product

import numpy as np
import numpy.typing as npt

from cellpilot.array_types import FloatArray, Int32Array, Int64Array
from cellpilot.recommend.job_arrays import JobArrays, step_inputs

IntArray = npt.NDArray[np.integer]

DEFAULT_CHUNK_JOBS = 64  # measured: small chunks keep the (chunk, D, K) temporaries in cache


class MarginMode(StrEnum):
    ADDITIVE = "additive"  # eq. 7: L_m = L'_m + M_m
    RELATIVE = "relative"  # L_m = L'_m * (1 + M_m)


def decay_for_half_life(windows: float) -> float:
    """The rate d whose smoothing (1 - d)^n halves after ``windows`` steps."""
    return float(1.0 - 2.0 ** (-1.0 / windows))


# Default grid (the paper does not publish its grid): decay half-lives from one 5-minute
# window to one week, geometrically spaced, times ten margins.
DEFAULT_HALF_LIVES: tuple[float, ...] = tuple(np.geomspace(1.0, 7 * 288.0, 10).tolist())
DEFAULT_DECAY_RATES: tuple[float, ...] = tuple(decay_for_half_life(h) for h in DEFAULT_HALF_LIVES)
# Eq. 7's additive M_m, in units of ``ModelGrid.margin_unit``: 0, then 1/128 ... 2 (doubling).
DEFAULT_ADDITIVE_MARGINS: tuple[float, ...] = (0.0, *(2.0**k for k in range(-7, 2)))
# Relative margins (``MarginMode.RELATIVE``): 0 to 25 %.
DEFAULT_RELATIVE_MARGINS: tuple[float, ...] = (0.0, 0.02, 0.04, 0.06, 0.08, 0.10, 0.125, 0.15, 0.20, 0.25)
DEFAULT_MARGINS: dict[MarginMode, tuple[float, ...]] = {
    MarginMode.ADDITIVE: DEFAULT_ADDITIVE_MARGINS,
    MarginMode.RELATIVE: DEFAULT_RELATIVE_MARGINS,
}


@dataclass(frozen=True)
class ModelGrid:
    """The ensemble: model m has decay rate ``decay_rates[m]`` and margin ``margins[m]``."""

    decay_rates: tuple[float, ...]
    margins: tuple[float, ...]
    margin_mode: MarginMode = MarginMode.ADDITIVE
    margin_unit: float = 1.0  # additive margins are multiples of it (the resource's unit)
    distinct_decays: tuple[float, ...] = field(init=False, repr=False)
    decay_index: npt.NDArray[np.intp] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.decay_rates) != len(self.margins) or not self.decay_rates:
            raise ValueError("need one decay rate and one margin per model, at least one model")
        if any(not 0.0 < d <= 1.0 for d in self.decay_rates):
            raise ValueError("decay rates must be in (0, 1]")
        if self.margin_mode is MarginMode.RELATIVE and any(m <= -1.0 for m in self.margins):
            raise ValueError("relative margins must exceed -1")
        if not self.margin_unit > 0.0:
            raise ValueError("margin_unit must be positive")
        distinct = tuple(sorted(set(self.decay_rates)))
        object.__setattr__(self, "distinct_decays", distinct)
        index = np.searchsorted(np.asarray(distinct), np.asarray(self.decay_rates)).astype(np.intp)
        index.setflags(write=False)
        object.__setattr__(self, "decay_index", index)

    @classmethod
    def product(
        cls,
        decay_rates: tuple[float, ...] = DEFAULT_DECAY_RATES,
        margins: tuple[float, ...] | None = None,
        margin_mode: MarginMode = MarginMode.ADDITIVE,
    ) -> ModelGrid:
        """Every combination of the given decay rates and margins (decay-major order);
        ``margins`` defaults to the mode's default ladder."""
        chosen = DEFAULT_MARGINS[margin_mode] if margins is None else margins
        pairs = list(product(decay_rates, chosen))
        return cls(tuple(p[0] for p in pairs), tuple(p[1] for p in pairs), margin_mode)

    def with_unit(self, margin_unit: float) -> ModelGrid:
        return replace(self, margin_unit=float(margin_unit))

    @property
    def models(self) -> int:
        return len(self.decay_rates)

    def limit_values(self, boundaries: FloatArray, raw_index: IntArray) -> FloatArray:
        """Eq. 7 for every model: L_m from the raw limit index L'_m (last axis = model)."""
        raw = boundaries[raw_index]
        margins = np.asarray(self.margins)
        if self.margin_mode is MarginMode.ADDITIVE:
            return np.asarray(raw + margins * self.margin_unit, dtype=np.float64)
        return np.asarray(raw * (1.0 + margins), dtype=np.float64)

    def describe(self, model: int) -> str:
        margin = self.margins[model]
        relative = self.margin_mode is MarginMode.RELATIVE
        shown = f"{margin:+.1%}" if relative else f"{margin * self.margin_unit:+g}"
        return f"model {model} (d={self.decay_rates[model]:.4g}, margin {shown})"


@dataclass(frozen=True)
class EnsembleConfig:
    """The five hyperparameters of §3.2.3 (d, w_o, w_u, w_dL, w_dm) and the model grid.

    The defaults are a reasonable starting point, not Google's values (the paper tunes
    them by offline parameter sweeps, :mod:`cellpilot.evaluate.autopilot_tuning`): w_o / w_u
    = 50 puts the unpenalised arg-min near the 98th percentile, and a limit or model change
    must save 1 % of one sample's worth of cost (of all samples, with normalised histograms).
    """

    grid: ModelGrid = field(default_factory=ModelGrid.product)
    cost_decay: float = 0.01  # d of eq. 8
    w_overrun: float = 1.0
    w_underrun: float = 0.02
    w_limit_change: float = 0.01
    w_model_change: float = 0.01
    # Eqs. 4-9 as written by default; the deviations are named options (module docstring).
    normalise_histograms: bool = False
    cost_at_previous_limit: bool = False

    def __post_init__(self) -> None:
        if not 0.0 < self.cost_decay <= 1.0:
            raise ValueError("cost_decay must be in (0, 1]")
        weights = (self.w_overrun, self.w_underrun, self.w_limit_change, self.w_model_change)
        if any(w < 0.0 for w in weights):
            raise ValueError("weights must be non-negative")


@dataclass(frozen=True, eq=False)
class EnsembleState(JobArrays):
    smoothed: FloatArray  # (J, D, K): H_d, one smoothed histogram per distinct decay rate
    raw_limit: Int32Array  # (J, M): L'_m[t-1] as a bucket index, -1 before the first step
    cost: FloatArray  # (J, M): c_m[t-1]
    model: Int32Array  # (J,): m[t-1], -1 before the first step
    updates: Int64Array  # (J,)
    last_ms: Int64Array  # (J,)


def initial_ensemble_state(jobs: int, buckets: int, config: EnsembleConfig) -> EnsembleState:
    models = config.grid.models
    return EnsembleState(
        smoothed=np.zeros((jobs, len(config.grid.distinct_decays), buckets)),
        raw_limit=np.full((jobs, models), -1, dtype=np.int32),
        cost=np.zeros((jobs, models)),
        model=np.full(jobs, -1, dtype=np.int32),
        updates=np.zeros(jobs, dtype=np.int64),
        last_ms=np.zeros(jobs, dtype=np.int64),
    )


@dataclass(frozen=True, eq=False)
class EnsembleDecision:
    """Eq. 9's outcome per job, with what explains it."""

    limit: FloatArray  # L[t]
    model: Int32Array  # m[t]
    raw_limit: FloatArray  # L'_{m[t]}[t], the winning model's limit before its margin
    margin: FloatArray  # M_{m[t]}, the grid's value (relative, or in units of margin_unit)
    cost: FloatArray  # c_{m[t]}[t]
    limit_changed: npt.NDArray[np.bool_]  # L[t] != L[t-1]
    model_changed: npt.NDArray[np.bool_]  # m[t] != m[t-1]


def model_limits(config: EnsembleConfig, boundaries: FloatArray, state: EnsembleState) -> FloatArray:
    """(J, M) current limit L_m of every model (NaN before the first step), for dashboards."""
    limits = config.grid.limit_values(boundaries, np.maximum(state.raw_limit, 0))
    return np.where(state.raw_limit >= 0, limits, np.nan)


def update_ensemble(
    config: EnsembleConfig,
    boundaries: FloatArray,
    state: EnsembleState,
    counts: npt.ArrayLike,
    time_ms: npt.ArrayLike,
    *,
    chunk_jobs: int = DEFAULT_CHUNK_JOBS,
) -> tuple[EnsembleState, EnsembleDecision]:
    """One step of eqs. 4-9 for every job (``counts`` (J, K), ``time_ms`` (J,)); pure."""
    grid = config.grid
    jobs, decays, buckets = state.smoothed.shape
    models = grid.models
    s_all, t = step_inputs(counts, time_ms, buckets, state.updates, state.last_ms)
    if (
        decays != len(grid.distinct_decays)
        or state.raw_limit.shape != (jobs, models)
        or buckets != boundaries.size
    ):
        raise ValueError("state was built for a different model grid or bucket scheme")

    d = np.asarray(grid.distinct_decays)[None, :, None]
    dm = grid.decay_index
    w_o, w_u, w_dl, w_dm = config.w_overrun, config.w_underrun, config.w_limit_change, config.w_model_change
    model_ids = np.arange(models)

    smoothed = np.empty_like(state.smoothed)
    raw_limit = np.empty_like(state.raw_limit)
    cost = np.empty_like(state.cost)
    model = np.empty_like(state.model)
    limit = np.empty(jobs)
    limit_changed = np.empty(jobs, dtype=bool)

    for lo in range(0, jobs, chunk_jobs):
        hi = min(lo + chunk_jobs, jobs)
        n = hi - lo
        rows = np.arange(n)[:, None]
        s = s_all[lo:hi]
        if config.normalise_histograms:
            totals = s.sum(axis=1, keepdims=True)
            s = np.divide(s, totals, out=np.zeros_like(s), where=totals > 0.0)

        # Eqs. 4-5 through the smoothed histogram: H <- (1 - d) H + d s, as H + d (s - H).
        h = smoothed[lo:hi]
        old = state.smoothed[lo:hi]
        np.subtract(s[:, None, :], old, out=h)
        h *= d
        h += old
        # Cost of limit L = b[k] for each distinct decay, before the change penalty:
        # w_o * o(b[k]) + w_u * u(b[k]) with o = sum_{j > k} H[j] = T - P[k] and
        # u = sum_{j < k} H[j] = P[k] - H[k] (P the prefix sums, T the total). Every use
        # below compares costs of one decay rate, so the constant w_o * T is dropped:
        # base = (w_u - w_o) P[k] - w_u H[k], three passes over (jobs, D, K) instead of six.
        base = np.cumsum(h, axis=2)
        base *= w_u - w_o
        base -= w_u * h
        # Eq. 6: keep the previous limit, or move to the unpenalised arg-min.
        best = np.argmin(base, axis=2)  # (n, D)
        best_cost = np.take_along_axis(base, best[:, :, None], axis=2)[:, :, 0]
        prev = state.raw_limit[lo:hi].astype(np.intp)
        has_prev = prev >= 0
        stay_cost = base[rows, dm[None, :], np.maximum(prev, 0)]
        move_to = best[:, dm]
        move_cost = best_cost[:, dm] + w_dl
        stay = has_prev & ((stay_cost < move_cost) | ((stay_cost == move_cost) & (prev < move_to)))
        new_raw = np.where(stay, prev, move_to)
        del base

        # Eq. 7.
        limits = grid.limit_values(boundaries, new_raw)
        prev_limits = grid.limit_values(boundaries, np.maximum(prev, 0))
        changed = has_prev & (new_raw != prev)

        # Eq. 8: this window's overrun / underrun counts at the model's limit, decayed cost.
        at = np.where(has_prev, prev_limits, limits) if config.cost_at_previous_limit else limits
        cum_s = np.zeros((n, buckets + 1))
        np.cumsum(s, axis=1, out=cum_s[:, 1:])
        under_now = cum_s[rows, np.searchsorted(boundaries, at, side="left")]  # b[j] < L
        over_now = cum_s[:, -1:] - cum_s[rows, np.searchsorted(boundaries, at, side="right")]  # b[j] > L
        new_cost = config.cost_decay * (w_o * over_now + w_u * under_now + w_dl * changed)
        new_cost += (1.0 - config.cost_decay) * state.cost[lo:hi]

        # Eq. 9 (with L[t-1] for the circular L[t]; see the module docstring).
        prev_model = state.model[lo:hi].astype(np.intp)
        has_model = (prev_model >= 0)[:, None]
        prev_final = prev_limits[rows[:, 0], np.maximum(prev_model, 0)][:, None]
        score = new_cost + w_dm * (has_model & (model_ids[None, :] != prev_model[:, None]))
        score += w_dl * (has_model & (limits != prev_final))
        chosen = np.argmin(score, axis=1)

        raw_limit[lo:hi] = new_raw
        cost[lo:hi] = new_cost
        model[lo:hi] = chosen
        limit[lo:hi] = limits[rows[:, 0], chosen]
        limit_changed[lo:hi] = has_model[:, 0] & (limit[lo:hi] != prev_final[:, 0])

    picked = (np.arange(jobs), model)
    decision = EnsembleDecision(
        limit=limit,
        model=model.copy(),
        raw_limit=boundaries[raw_limit[picked]],
        margin=np.asarray(grid.margins)[model],
        cost=cost[picked],
        limit_changed=limit_changed,
        model_changed=(state.model >= 0) & (model != state.model),
    )
    new_state = EnsembleState(
        smoothed=smoothed,
        raw_limit=raw_limit,
        cost=cost,
        model=model,
        updates=state.updates + 1,
        last_ms=t.copy(),
    )
    return new_state, decision
