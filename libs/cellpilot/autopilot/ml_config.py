"""The one source of the ML recommender's hyperparameters (Autopilot §3.2.3).

§3.2.3: the ensemble's five hyperparameters (d, w_o, w_u, w_ΔL, w_Δm) are tuned "in
off-line experiments during which we simulate Autopilot behavior on a sample of saved
traces". The committed result of that sweep (``cellpilot eval autopilot-tune``) is
``data/ml_tuned.json`` in this package; the recommender workers load it, and so do the
studies, so the published numbers describe the configuration the services run. A cell
overrides it with its own file (the recommender's ``CELLPILOT_RECOMMENDER_ML_CONFIG``, the
CLI's ``--ml-config``).

A file is ``{"hyperparameters": {"cost_decay": ..., "w_overrun": ..., ...}}`` (extra keys,
such as the sweep's metrics, are kept for the reader and ignored here) or the bare mapping.
It may also name the model grid (``"grid": {"decay_half_lives_windows": [...], "margins":
[...]}``: every decay rate d_m with every margin M_m) and the deviations from eqs. 4-9 as
written (``"options": {"margin_mode": "additive" | "relative", "cost_at_previous_limit":
bool, "normalise_histograms": bool}``, see :mod:`cellpilot.recommend.ml_ensemble`); what a
file leaves out is the library default, eqs. 4-9 as written.

Units: a file's additive margins are per unit of the resource as people state it, one core of
CPU and one GiB of memory; :meth:`CandidateConfig.for_resource
<cellpilot.autopilot.candidates.CandidateConfig.for_resource>` scales them once into the
histograms' units (millicores, bytes). The weights carry no unit: eqs. 4-5 count samples
above and below a limit, and eq. 6's change penalty counts changes, so the same file gives
the same decisions whatever unit the histograms are in.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

from cellpilot.autopilot.candidates import CandidateConfig
from cellpilot.autopilot.job_recommendations import RecommenderConfig
from cellpilot.recommend.ml_ensemble import (
    DEFAULT_HALF_LIVES,
    EnsembleConfig,
    MarginMode,
    ModelGrid,
    decay_for_half_life,
)
from cellpilot.usage.buckets import Resource

# §3.2.3's five hyperparameters (d, w_o, w_u, w_ΔL, w_Δm) as EnsembleConfig fields.
ML_HYPERPARAMETERS: tuple[str, ...] = (
    "cost_decay",
    "w_overrun",
    "w_underrun",
    "w_limit_change",
    "w_model_change",
)
# The deviations from eqs. 4-9 as written (named options of the ensemble).
ML_OPTIONS: tuple[str, ...] = ("margin_mode", "cost_at_previous_limit", "normalise_histograms")
TUNED_FILE = "ml_tuned.json"
MAX_ML_CONFIG_BYTES = 1 << 20


def config_from_hyperparameters(values: dict[str, Any], base: EnsembleConfig | None = None) -> EnsembleConfig:
    """An :class:`EnsembleConfig` with the given hyperparameters (unknown keys are ignored)."""
    chosen: dict[str, Any] = {k: float(values[k]) for k in ML_HYPERPARAMETERS if k in values}
    return replace(base or EnsembleConfig(), **chosen)


def hyperparameters(config: EnsembleConfig) -> dict[str, float]:
    return {name: float(getattr(config, name)) for name in ML_HYPERPARAMETERS}


def options(config: EnsembleConfig) -> dict[str, Any]:
    """The config's choice for each deviation from eqs. 4-9 as written."""
    return {
        "margin_mode": config.grid.margin_mode.value,
        "cost_at_previous_limit": config.cost_at_previous_limit,
        "normalise_histograms": config.normalise_histograms,
    }


def half_life_windows(decay: float) -> float:
    """The inverse of :func:`decay_for_half_life`: windows until (1 - d)^n = 1/2."""
    return float(-1.0 / math.log2(1.0 - decay)) if decay < 1.0 else 0.0


def grid_description(grid: ModelGrid) -> dict[str, list[float]]:
    """A product grid as a file names it (decay half-lives in windows, margins)."""
    decays = sorted(set(grid.decay_rates), reverse=True)
    margins = sorted(set(grid.margins))
    return {"decay_half_lives_windows": [half_life_windows(d) for d in decays], "margins": margins}


def with_options(config: EnsembleConfig, chosen: dict[str, Any], where: str = "options") -> EnsembleConfig:
    """``config`` with the given deviations (unknown names are an error naming them)."""
    unknown = set(chosen) - set(ML_OPTIONS)
    if unknown:
        raise ValueError(f"{where}: unknown option(s) {sorted(unknown)} (known: {', '.join(ML_OPTIONS)})")
    out = config
    if "margin_mode" in chosen:
        mode = MarginMode(chosen["margin_mode"])
        grid = config.grid
        if mode is not grid.margin_mode:
            # The other mode's margins mean something else: its default ladder, same decays.
            decays = tuple(sorted(set(grid.decay_rates), reverse=True))
            grid = ModelGrid.product(decays, None, mode)
        out = replace(out, grid=grid)
    for name in ("cost_at_previous_limit", "normalise_histograms"):
        if name in chosen:
            if not isinstance(chosen[name], bool):
                raise ValueError(f"{where}.{name}: must be true or false")
            out = replace(out, **{name: chosen[name]})
    return out


def grid_from_description(values: dict[str, Any], mode: MarginMode, where: str = "grid") -> ModelGrid:
    half_lives = values.get("decay_half_lives_windows", list(DEFAULT_HALF_LIVES))
    margins = values.get("margins")
    try:
        decays = tuple(decay_for_half_life(float(h)) if float(h) > 0 else 1.0 for h in half_lives)
        chosen = None if margins is None else tuple(float(m) for m in margins)
        return ModelGrid.product(decays, chosen, mode)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{where}: {error}") from None


def ml_config_from_json(text: str, where: str = "ML config") -> EnsembleConfig:
    """Parse one configuration file's text; ValueError names what is wrong."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{where}: {error}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{where}: not a JSON object of hyperparameters")
    values = data.get("hyperparameters", data)
    if not isinstance(values, dict):
        raise ValueError(f"{where}: 'hyperparameters' must be an object")
    chosen_options = data.get("options", {})
    grid = data.get("grid")
    if not isinstance(chosen_options, dict) or not isinstance(grid, dict | None):
        raise ValueError(f"{where}: 'options' and 'grid' must be objects")
    try:
        config = with_options(config_from_hyperparameters(values), chosen_options)
        if grid is not None:
            config = replace(config, grid=grid_from_description(grid, config.grid.margin_mode))
        return config
    except (TypeError, ValueError) as error:
        raise ValueError(f"{where}: {error}") from None


def tuned_ml_text() -> str:
    return resources.files("cellpilot.autopilot").joinpath("data", TUNED_FILE).read_text(encoding="utf-8")


def load_ml_config(path: str | Path | None = None) -> EnsembleConfig:
    """The shipped (tuned) configuration, or the file at ``path`` when one is given."""
    if path is None or str(path) == "":
        return ml_config_from_json(tuned_ml_text(), f"cellpilot/autopilot/data/{TUNED_FILE}")
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"{file}: no such ML config file")
    if file.stat().st_size > MAX_ML_CONFIG_BYTES:
        raise ValueError(f"{file}: larger than {MAX_ML_CONFIG_BYTES} bytes")
    return ml_config_from_json(file.read_text(encoding="utf-8"), str(file))


def shipped_recommender_config(ml_config_path: str | Path | None = None, **options: Any) -> RecommenderConfig:
    """The recommenders as a worker runs them: the paper's defaults with the tuned ML
    hyperparameters (or the cell's own file) for both resources (the sweep tunes on memory,
    the paper's §4 focus; CPU uses the same weights)."""
    ensemble = load_ml_config(ml_config_path)
    return RecommenderConfig(
        cpu=CandidateConfig.for_resource(Resource.CPU, ensemble),
        memory=CandidateConfig.for_resource(Resource.MEMORY, ensemble),
        **options,
    )
