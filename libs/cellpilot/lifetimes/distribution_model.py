"""The lifetime *distribution* model (LAVA §3): LightGBM multiclass over lifetime bins.

§3 predicts a probability distribution of each VM's lifetime instead of one value,
and reprediction asks for the distribution of the remaining lifetime given the uptime
so far. This model maps a VM's creation-time features (what the scheduler knows when
the VM is created, :mod:`cellpilot.lifetimes.features`) to P(lifetime in bin k) over
:data:`~cellpilot.lifetimes.distribution.BIN_EDGES` with a gradient-boosted multiclass
classifier (§3 found GBDTs best), trained with log loss, so its probabilities are
calibrated estimates rather than scores. The uptime enters through conditioning
(:class:`~cellpilot.lifetimes.distribution.LifetimeDistribution`): P(L | x, L > u)
is P(L | x) truncated at u, which is exact when P(L | x) is right, and needs no model
call per reprediction.

Training holds out the latest ``validation_share`` of the history (by creation time)
and stops adding trees when the held-out log loss stops improving, so the number of
trees is chosen by the data, not by hand.

With ``DistributionParams(uptime_input=True)`` the uptime is also a model input, as in
§3 ("we pass an additional parameter T_u into the model"), trained on uptime-expanded
examples: every VM at each uptime of :data:`UPTIME_GRID_HOURS` it outlived
(:func:`~cellpilot.lifetimes.training_examples.expand_at_uptimes`), so long-lived VMs are
seen many times and the model learns how lifetimes behave at long uptimes directly
instead of through the tails of the creation-time distribution. A reprediction at uptime
u runs the model at the latest grid uptime g <= u, which gives P(L | x, L > g), and
conditions that on L > u (exact: the truncation of P(L | x, L > g) at u is P(L | x, L > u)).

API for schedulers and services: :meth:`DistributionModel.predict_distribution`
(batched, one LightGBM call), :meth:`DistributionModel.predict_distribution_one`
(LightGBM's single-row C entry point), :meth:`DistributionModel.predict_remaining`
(E[T_r | T_u], the drop-in for the point model), and save/load as one JSON file.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import lightgbm as lgb
import numpy as np
import numpy.typing as npt

from cellpilot.array_types import FloatArray
from cellpilot.lifetimes.distribution import (
    BIN_EDGES_HOURS,
    HOUR,
    NUM_BINS,
    LifetimeDistribution,
    lifetime_bin,
)
from cellpilot.lifetimes.features import CATEGORICAL, FEATURE_NAMES, NUM_FEATURES, UPTIME, model_inputs
from cellpilot.lifetimes.model import FastSingleRow, JsonModelFile, read_model_json
from cellpilot.lifetimes.training_examples import expand_at_uptimes

FORMAT = "cellpilot.lifetime-distribution/1"
# Uptimes (hours) at which an uptime-aware model sees each VM that outlived them (§3's expansion):
# creation and the lifetime bin edges from 1 min to 250 h.
UPTIME_GRID_HOURS: tuple[float, ...] = (
    0.0, 1 / 60, 10 / 60, 0.5, 1.0, 2.0, 4.0, 10.0, 24.0, 48.0, 100.0, 250.0,
)  # fmt: skip


@dataclass(frozen=True)
class DistributionParams:
    """LightGBM multiclass settings; deterministic (one thread, fixed seed)."""

    max_trees: int = 200  # per bin; early stopping picks fewer
    num_leaves: int = 15
    learning_rate: float = 0.1
    min_data_in_leaf: int = 50
    validation_share: float = 0.15  # latest share of the history held out for early stopping
    early_stopping_rounds: int = 10
    num_threads: int = 1
    seed: int = 0
    uptime_input: bool = False  # the uptime as an input, on uptime-expanded examples (§3)

    def __post_init__(self) -> None:
        if self.max_trees < 1 or self.num_leaves < 2 or self.min_data_in_leaf < 1 or self.num_threads < 1:
            raise ValueError("max_trees >= 1, num_leaves >= 2, min_data_in_leaf >= 1, num_threads >= 1")
        if not 0 < self.learning_rate <= 1:
            raise ValueError("learning_rate must be in (0, 1]")
        if not 0 <= self.validation_share < 1 or self.early_stopping_rounds < 1:
            raise ValueError("validation_share in [0, 1), early_stopping_rounds >= 1")

    def lightgbm(self, num_class: int) -> dict[str, Any]:
        return {
            "objective": "multiclass",
            "num_class": num_class,
            "num_leaves": self.num_leaves,
            "learning_rate": self.learning_rate,
            "min_data_in_leaf": self.min_data_in_leaf,
            "num_threads": self.num_threads,
            "seed": self.seed,
            "deterministic": True,
            "force_row_wise": True,
            "verbose": -1,
        }


class DistributionModel(JsonModelFile):
    """P(lifetime bin | creation-time features); remaining-lifetime answers by conditioning on uptime."""

    def __init__(
        self,
        booster: lgb.Booster,
        uptime_grid_hours: tuple[float, ...] | None = None,
        bins: tuple[int, ...] | None = None,
    ) -> None:
        self.booster = booster
        # The lifetime bins the model's classes stand for: those the training history had VMs in
        # (a bin nobody lived in gets probability 0, not a class LightGBM must learn to avoid).
        self.bins = tuple(range(NUM_BINS)) if bins is None else bins
        self._bins = np.asarray(self.bins, dtype=np.int64)
        # None: creation-time features only; else the grid of uptimes the model was trained at.
        self.uptime_grid_hours = uptime_grid_hours
        self.uptime_grid = None if uptime_grid_hours is None else np.asarray(uptime_grid_hours) * HOUR
        self._fast: FastSingleRow | None = None
        try:
            self._fast = FastSingleRow(booster, self.num_inputs, len(self.bins))
        except (AttributeError, OSError, RuntimeError):
            self._fast = None

    def __getstate__(self) -> dict[str, Any]:
        return {"booster": self.booster, "uptime_grid_hours": self.uptime_grid_hours, "bins": self.bins}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["booster"], state.get("uptime_grid_hours"), state.get("bins"))  # type: ignore[misc]

    def _full(self, probs: FloatArray) -> FloatArray:
        """The model's class probabilities spread onto all lifetime bins."""
        probs = np.atleast_2d(probs)
        out = np.zeros((probs.shape[0], NUM_BINS))
        out[:, self._bins] = probs
        return out

    @property
    def uptime_aware(self) -> bool:
        return self.uptime_grid is not None

    @property
    def num_inputs(self) -> int:
        return NUM_FEATURES + (1 if self.uptime_aware else 0)

    def grid_index(self, uptime_seconds: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """Per uptime, the index of the latest grid uptime at or below it (0 without a grid)."""
        u = np.atleast_1d(np.asarray(uptime_seconds, dtype=np.float64))
        if self.uptime_grid is None:
            return np.zeros(u.shape, dtype=np.int64)
        return np.clip(np.searchsorted(self.uptime_grid, u, side="right") - 1, 0, None).astype(np.int64)

    def _inputs(self, features: FloatArray, uptime_seconds: npt.ArrayLike) -> FloatArray:
        x = np.atleast_2d(np.asarray(features, dtype=np.float64))
        if x.shape[1] != NUM_FEATURES:
            raise ValueError(f"expected {NUM_FEATURES} feature columns, got {x.shape[1]}")
        if self.uptime_grid is None:
            return x
        u = np.broadcast_to(np.asarray(uptime_seconds, dtype=np.float64), (x.shape[0],))
        return model_inputs(x, self.uptime_grid[self.grid_index(u)])

    @property
    def has_fast_single_row(self) -> bool:
        return self._fast is not None

    @property
    def num_trees(self) -> int:
        return int(self.booster.num_trees())

    @classmethod
    def train(
        cls, features: FloatArray, lifetimes: FloatArray, params: DistributionParams | None = None
    ) -> DistributionModel:
        """Fits on VMs with known lifetimes (seconds); ``features`` rows in creation order."""
        params = params or DistributionParams()
        x = np.asarray(features, dtype=np.float64)
        life = np.asarray(lifetimes, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != NUM_FEATURES or x.shape[0] != life.shape[0]:
            raise ValueError(f"features must be (n, {NUM_FEATURES}) with one lifetime per row")
        if x.shape[0] < 2:
            raise ValueError("need at least two VMs to train on")
        split_vms = round(x.shape[0] * (1.0 - params.validation_share))
        names, categorical = list(FEATURE_NAMES), list(CATEGORICAL)
        grid_hours = UPTIME_GRID_HOURS if params.uptime_input else None
        if grid_hours is not None:
            # VMs split by creation first, then each part expanded: no VM on both sides.
            grid = np.asarray(grid_hours) * HOUR
            fit_x, fit_life, _ = expand_at_uptimes(x[:split_vms], life[:split_vms], grid)
            held_x, held_life, _ = expand_at_uptimes(x[split_vms:], life[split_vms:], grid)
            x, life = np.concatenate([fit_x, held_x]), np.concatenate([fit_life, held_life])
            split = fit_x.shape[0]
            names = [*names, UPTIME]
        else:
            split = split_vms
        bin_of = lifetime_bin(life)
        bins = np.unique(bin_of)
        if bins.size == 1:  # multiclass needs two classes: a neighbouring bin, with no examples
            bins = np.union1d(bins, [bins[0] + 1 if bins[0] + 1 < NUM_BINS else bins[0] - 1])
        y = np.searchsorted(bins, bin_of)
        train = lgb.Dataset(
            x[:split],
            label=y[:split],
            feature_name=names,
            categorical_feature=categorical,
            free_raw_data=True,
        )
        callbacks: list[Callable[..., Any]] = []
        valid_sets: list[lgb.Dataset] = []
        if 0 < split < x.shape[0]:
            valid_sets = [
                lgb.Dataset(
                    x[split:],
                    label=y[split:],
                    reference=train,
                    feature_name=names,
                    categorical_feature=categorical,
                )
            ]
            callbacks = [lgb.early_stopping(params.early_stopping_rounds, verbose=False)]
        booster = lgb.train(
            params.lightgbm(int(bins.size)),
            train,
            num_boost_round=params.max_trees,
            valid_sets=valid_sets,
            callbacks=callbacks,
        )
        if valid_sets and booster.best_iteration > 0:
            booster = lgb.Booster(model_str=booster.model_to_string(num_iteration=booster.best_iteration))
        return cls(booster, grid_hours, tuple(int(b) for b in bins))

    # ---------------------------------------------------------------- prediction
    def predict_distribution(
        self, features: FloatArray, uptime_seconds: npt.ArrayLike = 0.0
    ) -> LifetimeDistribution:
        """Lifetime distributions of a batch of ``features`` (n, F) as known at ``uptime_seconds``:
        one LightGBM call. Condition them on the same uptime (the distribution's methods take
        it) for the remaining lifetime. A creation-time model ignores the uptime here."""
        x = self._inputs(features, uptime_seconds)
        if x.shape[0] == 0:
            return LifetimeDistribution(np.ones((0, NUM_BINS)))
        return LifetimeDistribution(
            self._full(np.asarray(self.booster.predict(x, num_threads=1), dtype=np.float64))
        )

    def predict_probs_one(self, features: FloatArray, uptime_seconds: float = 0.0) -> FloatArray:
        """Bin probabilities of one VM (a fresh array), through the single-row entry point if present."""
        if self._fast is None:
            return self.predict_distribution(np.asarray(features)[None, :], uptime_seconds).probs[0]
        self._fast.row[:] = self._inputs(np.asarray(features)[None, :], uptime_seconds)[0]
        return self._full(self._fast.predict_all())[0]

    def predict_distribution_one(
        self, features: FloatArray, uptime_seconds: float = 0.0
    ) -> LifetimeDistribution:
        return LifetimeDistribution(self.predict_probs_one(features, uptime_seconds)[None, :])

    def predict_remaining(self, features: FloatArray, uptime_seconds: npt.ArrayLike) -> FloatArray:
        """E[T_r | T_u] in seconds for a batch (§3's reprediction quantity)."""
        return self.predict_distribution(features, uptime_seconds).expected_remaining(uptime_seconds)

    # -------------------------------------------------------------- persistence
    def to_json(self) -> str:
        return json.dumps(
            {
                "format": FORMAT,
                "features": list(FEATURE_NAMES),
                "bin_edges_hours": list(BIN_EDGES_HOURS),
                "uptime_grid_hours": None if self.uptime_grid_hours is None else list(self.uptime_grid_hours),
                "bins": list(self.bins),
                "booster": self.booster.model_to_string(),
            }
        )

    @classmethod
    def from_json(cls, text: str) -> DistributionModel:
        data = read_model_json(
            text,
            FORMAT,
            "lifetime distribution model",
            [("features", FEATURE_NAMES, "features"), ("bin_edges_hours", BIN_EDGES_HOURS, "lifetime bins")],
        )
        grid = data.get("uptime_grid_hours")
        bins = data.get("bins")
        return cls(
            lgb.Booster(model_str=data["booster"]),
            None if grid is None else tuple(grid),
            None if bins is None else tuple(int(b) for b in bins),
        )
