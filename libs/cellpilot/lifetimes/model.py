"""The remaining-lifetime model (LAVA §3): gradient-boosted trees (LightGBM) over the VM's
features plus its uptime, trained on uptime-expanded examples.

§3 chose GBDTs and feeds the uptime T_u as an input, so one regression model answers
"given the VM has run for T_u, how long will it still run?" and can be re-run on the
fly (§3 option 2) whenever a VM or host is re-evaluated.

Labels. ``LabelTransform.MEAN`` (the default) fits the remaining lifetime in hours
with squared error: the model estimates E[T_r | features, T_u], §3's label.
``LabelTransform.LOG`` fits log1p(remaining minutes) instead: a geometric-mean
estimate, less swayed by the heavy tail, offered for comparison.

Prediction paths. :meth:`LifetimeModel.predict_remaining` takes a batch (one
LightGBM call for all rows). :meth:`LifetimeModel.predict_remaining_one` takes one VM
and, when LightGBM's C library exposes it, goes through its single-row "fast" entry
point (``LGBM_BoosterPredictForMatSingleRowFast``) with a pre-built configuration:
``Booster.predict`` on one row spends tens of microseconds in Python-side argument
checks, conversions and per-call setup, while the tree walk itself takes a few.
§3 embeds the model in the scheduler binary for the same reason (9 us median, §3
and Figure 8). Saving and loading go through one JSON file holding the booster text.
"""

from __future__ import annotations

import ctypes
import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Self

import lightgbm as lgb
import numpy as np
import numpy.typing as npt

from cellpilot.array_types import FloatArray
from cellpilot.lifetimes.features import CATEGORICAL, FEATURE_NAMES, MODEL_INPUTS, NUM_FEATURES, model_inputs
from cellpilot.lifetimes.training_examples import UPTIME_FRACTIONS, expand_examples

FORMAT = "cellpilot.lifetime-model/1"


class LabelTransform(StrEnum):
    MEAN = "mean"  # remaining hours, squared error: E[T_r | T_u] (§3)
    LOG = "log"  # log1p(remaining minutes), squared error

    def forward(self, remaining_seconds: FloatArray) -> FloatArray:
        if self is LabelTransform.LOG:
            return np.log1p(np.maximum(remaining_seconds, 0.0) / 60.0)
        return np.maximum(remaining_seconds, 0.0) / 3600.0

    def inverse(self, label: FloatArray) -> FloatArray:
        if self is LabelTransform.LOG:
            return 60.0 * np.expm1(np.maximum(label, 0.0))
        return 3600.0 * np.maximum(label, 0.0)


@dataclass(frozen=True)
class TrainingParams:
    """LightGBM settings; small, deterministic defaults (one thread, fixed seed)."""

    num_trees: int = 100
    num_leaves: int = 31
    learning_rate: float = 0.1
    min_data_in_leaf: int = 50
    feature_fraction: float = 1.0
    label: LabelTransform = LabelTransform.MEAN
    # Labels are capped at this many hours (None: no cap); see the module docstring.
    label_cap_hours: float | None = 1000.0
    num_threads: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "label", LabelTransform(self.label))
        if self.num_trees < 1 or self.num_leaves < 2 or self.min_data_in_leaf < 1 or self.num_threads < 1:
            raise ValueError("num_trees >= 1, num_leaves >= 2, min_data_in_leaf >= 1, num_threads >= 1")
        if not 0 < self.learning_rate <= 1 or not 0 < self.feature_fraction <= 1:
            raise ValueError("learning_rate and feature_fraction must be in (0, 1]")
        if self.label_cap_hours is not None and self.label_cap_hours <= 0:
            raise ValueError("label_cap_hours must be > 0")

    def lightgbm(self) -> dict[str, Any]:
        return {
            "objective": "regression",
            "num_leaves": self.num_leaves,
            "learning_rate": self.learning_rate,
            "min_data_in_leaf": self.min_data_in_leaf,
            "feature_fraction": self.feature_fraction,
            "num_threads": self.num_threads,
            "seed": self.seed,
            "deterministic": True,
            "force_row_wise": True,
            "verbose": -1,
        }


class FastSingleRow:
    """LightGBM's single-row prediction entry point with a configuration built once."""

    def __init__(self, booster: lgb.Booster, ncol: int, n_out: int = 1) -> None:
        from lightgbm import basic  # the loaded C library; private but stable across 3.x/4.x

        lib = basic._LIB
        self._lib = lib
        self._booster = booster  # keeps the handle alive as long as the config
        self._config = ctypes.c_void_p()
        status = lib.LGBM_BoosterPredictForMatSingleRowFastInit(
            booster._handle,
            ctypes.c_int(0),  # C_API_PREDICT_NORMAL
            ctypes.c_int(0),  # start iteration
            ctypes.c_int(-1),  # all iterations
            ctypes.c_int(1),  # C_API_DTYPE_FLOAT64
            ctypes.c_int32(ncol),
            ctypes.c_char_p(b"num_threads=1"),
            ctypes.byref(self._config),
        )
        if status != 0:
            raise RuntimeError("LightGBM fast single-row init failed")
        self.row = np.zeros(ncol, dtype=np.float64)
        self._out = np.zeros(n_out, dtype=np.float64)
        self._out_len = ctypes.c_int64()
        self._row_ptr = self.row.ctypes.data_as(ctypes.POINTER(ctypes.c_double))
        self._out_ptr = self._out.ctypes.data_as(ctypes.POINTER(ctypes.c_double))
        self._call = lib.LGBM_BoosterPredictForMatSingleRowFast
        self._out_len_ref = ctypes.byref(self._out_len)

    def predict(self) -> float:
        return float(self.predict_all()[0])

    def predict_all(self) -> npt.NDArray[np.float64]:
        """Every output of the model for ``row`` (a view, overwritten by the next call)."""
        if self._call(self._config, self._row_ptr, self._out_len_ref, self._out_ptr) != 0:
            raise RuntimeError("LightGBM fast single-row prediction failed")
        return self._out

    def __del__(self) -> None:
        config = getattr(self, "_config", None)
        if config is not None and config.value:
            self._lib.LGBM_FastConfigFree(config)
            config.value = None


class JsonModelFile:
    """A trained model kept as one JSON document: ``save`` and ``load`` go through the
    subclass's ``to_json`` / ``from_json``."""

    def to_json(self) -> str:
        raise NotImplementedError

    @classmethod
    def from_json(cls, text: str) -> Self:
        raise NotImplementedError

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> Self:
        return cls.from_json(Path(path).read_text())


def read_model_json(
    text: str, file_format: str, what: str, trained_on: Sequence[tuple[str, Any, str]]
) -> Any:
    """The JSON document of a ``what`` file of ``file_format``, after checking that each
    ``(key, expected, words)`` of ``trained_on`` holds what this code was built for."""
    data = json.loads(text)
    if data.get("format") != file_format:
        raise ValueError(f"not a {what} file (format {data.get('format')!r})")
    for key, expected, words in trained_on:
        if tuple(data.get(key, ())) != expected:
            raise ValueError(f"the model was trained on different {words}")
    return data


class LifetimeModel(JsonModelFile):
    """Predicts a VM's remaining lifetime (seconds) from its features and uptime (seconds)."""

    def __init__(self, booster: lgb.Booster, label: LabelTransform) -> None:
        self.booster = booster
        self.label = label
        self._fast: FastSingleRow | None = None
        try:
            self._fast = FastSingleRow(booster, NUM_FEATURES + 1)
        except (AttributeError, OSError, RuntimeError):
            self._fast = None  # fall back to Booster.predict

    def __getstate__(self) -> dict[str, Any]:
        """Pickles as the booster and the label (the single-row entry point is rebuilt), so a
        study can ship the model to the processes that run its shards."""
        return {"booster": self.booster, "label": self.label}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["booster"], state["label"])  # type: ignore[misc]

    @property
    def has_fast_single_row(self) -> bool:
        return self._fast is not None

    # ------------------------------------------------------------------ training
    @classmethod
    def train(
        cls,
        features: FloatArray,
        lifetimes: FloatArray,
        params: TrainingParams | None = None,
        fractions: tuple[float, ...] = UPTIME_FRACTIONS,
    ) -> LifetimeModel:
        """Fits the model on VMs with known lifetimes (seconds), expanded at ``fractions``."""
        params = params or TrainingParams()
        inputs, remaining, _ = expand_examples(features, lifetimes, fractions)
        if params.label_cap_hours is not None:
            remaining = np.minimum(remaining, params.label_cap_hours * 3600.0)
        dataset = lgb.Dataset(
            inputs,
            label=params.label.forward(remaining),
            feature_name=list(MODEL_INPUTS),
            categorical_feature=list(CATEGORICAL),
            free_raw_data=True,
        )
        booster = lgb.train(params.lightgbm(), dataset, num_boost_round=params.num_trees)
        return cls(booster, params.label)

    # ---------------------------------------------------------------- prediction
    def predict_remaining(self, features: FloatArray, uptime_seconds: npt.ArrayLike) -> FloatArray:
        """Remaining lifetime in seconds for a batch: ``features`` (n, F), uptimes (n,) or scalar."""
        inputs = model_inputs(features, uptime_seconds)
        if inputs.shape[0] == 0:
            return np.zeros(0)
        raw = np.asarray(self.booster.predict(inputs, num_threads=1), dtype=np.float64)
        return self.label.inverse(raw)

    def predict_remaining_one(self, features: FloatArray, uptime_seconds: float) -> float:
        """Remaining lifetime in seconds of one VM (``features`` is one row of F values)."""
        if self._fast is None:
            return float(self.predict_remaining(np.asarray(features)[None, :], uptime_seconds)[0])
        row = self._fast.row
        row[:NUM_FEATURES] = features
        row[NUM_FEATURES] = uptime_seconds / 3600.0
        raw = self._fast.predict()
        if self.label is LabelTransform.LOG:
            return 60.0 * float(np.expm1(max(raw, 0.0)))
        return 3600.0 * max(raw, 0.0)

    # -------------------------------------------------------------- persistence
    def to_json(self) -> str:
        return json.dumps(
            {
                "format": FORMAT,
                "label": self.label.value,
                "features": list(FEATURE_NAMES),
                "inputs": list(MODEL_INPUTS),
                "booster": self.booster.model_to_string(),
            }
        )

    @classmethod
    def from_json(cls, text: str) -> LifetimeModel:
        data = read_model_json(text, FORMAT, "lifetime model", [("inputs", MODEL_INPUTS, "inputs")])
        return cls(lgb.Booster(model_str=data["booster"]), LabelTransform(data["label"]))
