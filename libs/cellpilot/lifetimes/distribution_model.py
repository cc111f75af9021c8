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

API for schedulers and services: :meth:`DistributionModel.predict_distribution`
(batched, one LightGBM call), :meth:`DistributionModel.predict_distribution_one`
(LightGBM's single-row C entry point), :meth:`DistributionModel.predict_remaining`
(E[T_r | T_u], the drop-in for the point model), and save/load as one JSON file.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightgbm as lgb
import numpy as np
import numpy.typing as npt

from cellpilot.lifetimes.distribution import BIN_EDGES_HOURS, NUM_BINS, LifetimeDistribution, lifetime_bin
from cellpilot.lifetimes.features import CATEGORICAL, FEATURE_NAMES, NUM_FEATURES
from cellpilot.lifetimes.model import FastSingleRow

FloatArray = npt.NDArray[np.float64]

FORMAT = "cellpilot.lifetime-distribution/1"


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

    def __post_init__(self) -> None:
        if self.max_trees < 1 or self.num_leaves < 2 or self.min_data_in_leaf < 1 or self.num_threads < 1:
            raise ValueError("max_trees >= 1, num_leaves >= 2, min_data_in_leaf >= 1, num_threads >= 1")
        if not 0 < self.learning_rate <= 1:
            raise ValueError("learning_rate must be in (0, 1]")
        if not 0 <= self.validation_share < 1 or self.early_stopping_rounds < 1:
            raise ValueError("validation_share in [0, 1), early_stopping_rounds >= 1")

    def lightgbm(self) -> dict[str, Any]:
        return {
            "objective": "multiclass",
            "num_class": NUM_BINS,
            "num_leaves": self.num_leaves,
            "learning_rate": self.learning_rate,
            "min_data_in_leaf": self.min_data_in_leaf,
            "num_threads": self.num_threads,
            "seed": self.seed,
            "deterministic": True,
            "force_row_wise": True,
            "verbose": -1,
        }


class DistributionModel:
    """P(lifetime bin | creation-time features); remaining-lifetime answers by conditioning on uptime."""

    def __init__(self, booster: lgb.Booster) -> None:
        self.booster = booster
        self._fast: FastSingleRow | None = None
        try:
            self._fast = FastSingleRow(booster, NUM_FEATURES, NUM_BINS)
        except (AttributeError, OSError, RuntimeError):
            self._fast = None

    def __getstate__(self) -> dict[str, Any]:
        return {"booster": self.booster}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["booster"])  # type: ignore[misc]

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
        y = lifetime_bin(lifetimes)
        if x.ndim != 2 or x.shape[1] != NUM_FEATURES or x.shape[0] != y.shape[0]:
            raise ValueError(f"features must be (n, {NUM_FEATURES}) with one lifetime per row")
        if x.shape[0] < 2:
            raise ValueError("need at least two VMs to train on")
        split = round(x.shape[0] * (1.0 - params.validation_share))
        names, categorical = list(FEATURE_NAMES), list(CATEGORICAL)
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
            params.lightgbm(),
            train,
            num_boost_round=params.max_trees,
            valid_sets=valid_sets,
            callbacks=callbacks,
        )
        if valid_sets and booster.best_iteration > 0:
            booster = lgb.Booster(model_str=booster.model_to_string(num_iteration=booster.best_iteration))
        return cls(booster)

    # ---------------------------------------------------------------- prediction
    def predict_distribution(self, features: FloatArray) -> LifetimeDistribution:
        """Lifetime distributions at creation for a batch of ``features`` (n, F): one LightGBM call."""
        x = np.atleast_2d(np.asarray(features, dtype=np.float64))
        if x.shape[1] != NUM_FEATURES:
            raise ValueError(f"expected {NUM_FEATURES} feature columns, got {x.shape[1]}")
        if x.shape[0] == 0:
            return LifetimeDistribution(np.ones((0, NUM_BINS)))
        return LifetimeDistribution(self.booster.predict(x, num_threads=1))

    def predict_probs_one(self, features: FloatArray) -> FloatArray:
        """Bin probabilities of one VM (a fresh array), through the single-row entry point if present."""
        if self._fast is None:
            return self.predict_distribution(np.asarray(features)[None, :]).probs[0]
        self._fast.row[:] = features
        return self._fast.predict_all().copy()

    def predict_distribution_one(self, features: FloatArray) -> LifetimeDistribution:
        return LifetimeDistribution(self.predict_probs_one(features)[None, :])

    def predict_remaining(self, features: FloatArray, uptime_seconds: npt.ArrayLike) -> FloatArray:
        """E[T_r | T_u] in seconds for a batch (§3's reprediction quantity)."""
        return self.predict_distribution(features).expected_remaining(uptime_seconds)

    # -------------------------------------------------------------- persistence
    def to_json(self) -> str:
        return json.dumps(
            {
                "format": FORMAT,
                "features": list(FEATURE_NAMES),
                "bin_edges_hours": list(BIN_EDGES_HOURS),
                "booster": self.booster.model_to_string(),
            }
        )

    @classmethod
    def from_json(cls, text: str) -> DistributionModel:
        data = json.loads(text)
        if data.get("format") != FORMAT:
            raise ValueError(f"not a lifetime distribution model file (format {data.get('format')!r})")
        if tuple(data.get("features", ())) != FEATURE_NAMES:
            raise ValueError("the model was trained on different features")
        if tuple(data.get("bin_edges_hours", ())) != BIN_EDGES_HOURS:
            raise ValueError("the model was trained on different lifetime bins")
        return cls(lgb.Booster(model_str=data["booster"]))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> DistributionModel:
        return cls.from_json(Path(path).read_text())
