"""The ML configuration files: eqs. 4-9 as written unless a file names a deviation."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cellpilot.autopilot.candidates import ML_MARGIN_UNITS, CandidateConfig
from cellpilot.autopilot.ml_config import half_life_windows, ml_config_from_json, options
from cellpilot.recommend.ml_ensemble import (
    DEFAULT_HALF_LIVES,
    EnsembleConfig,
    MarginMode,
    decay_for_half_life,
)
from cellpilot.usage.buckets import Resource


def test_a_file_without_options_is_eqs_4_to_9_as_written() -> None:
    config = ml_config_from_json(json.dumps({"hyperparameters": {"w_underrun": 0.01}}))
    assert options(config) == {
        "margin_mode": "additive",
        "cost_at_previous_limit": False,
        "normalise_histograms": False,
    }
    assert config.w_underrun == 0.01
    assert options(EnsembleConfig()) == options(config)


@pytest.mark.parametrize(
    ("data", "named"),
    [
        ({"options": {"margin_modes": "additive"}}, "margin_modes"),
        ({"options": {"margin_mode": "sideways"}}, "sideways"),
        ({"options": {"normalise_histograms": "yes"}}, "normalise_histograms"),
        ({"grid": {"decay_half_lives_windows": [1.0], "margins": ["x"]}}, "x"),
        ({"options": []}, "options"),
    ],
    ids=["unknown option", "unknown mode", "not a bool", "bad margin", "not an object"],
)
def test_a_bad_file_is_an_error_naming_what_is_wrong(data: dict[str, object], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        ml_config_from_json(json.dumps({"hyperparameters": {}, **data}), "cell.json")


def test_options_and_grid_are_read() -> None:
    text = json.dumps(
        {
            "options": {"margin_mode": "relative", "normalise_histograms": True},
            "grid": {"decay_half_lives_windows": [1.0, 12.0], "margins": [0.0, 0.1]},
        }
    )
    config = ml_config_from_json(text)
    assert config.grid.margin_mode is MarginMode.RELATIVE
    assert config.normalise_histograms
    assert not config.cost_at_previous_limit
    assert config.grid.models == 4
    assert sorted({half_life_windows(d) for d in config.grid.decay_rates}) == pytest.approx([1.0, 12.0])


def test_half_life_inverts_the_decay_rate() -> None:
    for h in DEFAULT_HALF_LIVES:
        assert half_life_windows(decay_for_half_life(h)) == pytest.approx(h)


@pytest.mark.parametrize("resource", list(Resource), ids=str)
def test_additive_margins_are_in_the_resources_unit(resource: Resource) -> None:
    # Eq. 7: L_m = L'_m + M_m, with M_m in cores for CPU and GiB for memory.
    config = CandidateConfig.for_resource(resource, EnsembleConfig())
    grid = config.ensemble.grid
    assert grid.margin_unit == ML_MARGIN_UNITS[resource]
    boundaries = config.scheme.boundaries
    raw = np.full(grid.models, 10, dtype=np.intp)
    limits = grid.limit_values(boundaries, raw)
    assert limits == pytest.approx(boundaries[10] + np.asarray(grid.margins) * ML_MARGIN_UNITS[resource])
