"""The §3.2.3 hyperparameter sweep and the committed tuned configuration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cellpilot.autopilot.ml_config import (
    config_from_hyperparameters,
    hyperparameters,
    load_ml_config,
    ml_config_from_json,
    options,
)
from cellpilot.cli import eval_autopilot
from cellpilot.evaluate.autopilot_tuning import (
    HYPERPARAMETERS,
    TuningGrid,
    TuningSetup,
    config_file_data,
    run_sweep,
)
from cellpilot.recommend.ml_ensemble import EnsembleConfig

ROOT = Path(__file__).resolve().parents[3]
TUNED = ROOT / "libs" / "cellpilot" / "autopilot" / "data" / "ml_tuned.json"


def test_grid_fixes_w_overrun_and_covers_the_product() -> None:
    grid = TuningGrid(
        variants=("as-written",),
        cost_decay=(0.01, 0.02),
        w_underrun=(0.1,),
        w_limit_change=(0.01, 0.1),
        w_model_change=(0.0,),
    )
    configs = [config for _, _, config in grid.configs()]
    assert len(configs) == 4
    assert {c.w_overrun for c in configs} == {1.0}
    assert {(c.cost_decay, c.w_limit_change) for c in configs} == {
        (0.01, 0.01),
        (0.01, 0.1),
        (0.02, 0.01),
        (0.02, 0.1),
    }


@pytest.mark.parametrize(
    ("variant", "expected"),
    [
        ("as-written", ("additive", False, False)),
        ("relative-margins", ("relative", False, False)),
        ("cost-at-previous", ("additive", True, False)),
        ("normalised", ("additive", False, True)),
        ("all-three", ("relative", True, True)),
    ],
    ids=lambda v: str(v),
)
def test_each_variant_is_eqs_4_to_9_with_its_named_deviations(
    variant: str, expected: tuple[str, bool, bool]
) -> None:
    grid = TuningGrid(
        variants=(variant,), model_grids=("10x10", "5x5"), cost_decay=(0.01,), w_underrun=(0.01,)
    )
    points = grid.configs()
    assert {g for _, g, _ in points} == {"10x10", "5x5"}
    for _, grid_name, config in points:
        assert tuple(options(config).values()) == expected
        assert config.grid.models == (100 if grid_name == "10x10" else 25)


def test_a_chosen_configuration_file_round_trips_options_and_grid() -> None:
    _, _, config = TuningGrid(variants=("all-three",), model_grids=("5x5",)).configs()[0]
    again = ml_config_from_json(json.dumps(config_file_data(config)))
    assert options(again) == options(config)
    assert hyperparameters(again) == hyperparameters(config)
    assert again.grid.margins == config.grid.margins
    assert again.grid.decay_rates == pytest.approx(config.grid.decay_rates)


def test_hyperparameters_round_trip() -> None:
    config = EnsembleConfig(cost_decay=0.05, w_underrun=0.3, w_limit_change=0.2, w_model_change=0.1)
    again = config_from_hyperparameters(hyperparameters(config))
    assert hyperparameters(again) == hyperparameters(config)
    assert set(hyperparameters(config)) == set(HYPERPARAMETERS)


def test_tune_and_report_seeds_must_differ() -> None:
    with pytest.raises(ValueError):
        TuningSetup(tune_seeds=(1, 2), report_seeds=(2, 3))


def test_a_tiny_sweep_chooses_one_of_its_configurations() -> None:
    grid = TuningGrid(
        variants=("as-written", "normalised"),
        cost_decay=(0.01,),
        w_underrun=(0.02, 0.4),
        w_limit_change=(0.01,),
        w_model_change=(0.01,),
    )
    setup = TuningSetup(jobs=3, days=1, warmup_days=1, tune_seeds=(5,), report_seeds=(6,), grid=grid)
    seen: list[tuple[int, int]] = []
    sweep = run_sweep(setup, progress=lambda done, total: seen.append((done, total)))
    # Progress counts job-days: one tuning and one report population of 3 jobs x 2 days.
    assert seen[0] == (0, 12)
    assert seen[-1] == (12, 12)
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)
    assert sweep["chosen"]["hyperparameters"]["w_underrun"] in (0.02, 0.4)
    assert len(sweep["table"]) == 4
    assert sweep["held_out_choice"] in ("as-written", "normalised")
    # The shipped variant is the one the report seeds support, with the weights tuned for it.
    chosen = sweep["per_variant"][sweep["held_out_choice"]]
    assert sweep["chosen"]["hyperparameters"]["w_underrun"] == chosen["w_underrun"]
    assert sweep["chosen"]["options"]["normalise_histograms"] == (sweep["held_out_choice"] == "normalised")
    assert sweep["admissible"] == sum(row["violation"] == 0.0 for row in sweep["table"])
    assert set(sweep["report"]) == {"as-written", "normalised", "library-default", "moving-window", "vpa"}
    # Admissible rows never do worse than the moving window on the tuning seeds.
    base = sweep["tune_baseline_moving_window"]
    for row in sweep["table"]:
        if row["violation"] == 0.0:
            assert row["relative_oom_rate_per_task_day"] <= base["relative_oom_rate_per_task_day"]
            assert row["oom_free_job_days_fraction"] >= sweep["setup"]["required_oom_free_job_days_fraction"]
    assert sweep["setup"]["required_oom_free_job_days_fraction"] >= setup.reliability


def test_the_committed_tuned_configuration_loads_and_is_the_default() -> None:
    assert TUNED.exists(), "run `cellpilot eval autopilot-tune` and commit its output"
    config = load_ml_config(TUNED)
    shipped = load_ml_config()  # what the workers load
    assert hyperparameters(shipped) == hyperparameters(config)
    assert options(shipped) == options(config)
    assert shipped.grid == config.grid
    data = json.loads(TUNED.read_text())
    assert hyperparameters(config) == pytest.approx(data["hyperparameters"])
    assert set(data["tuned_on"]["tune_seeds"]).isdisjoint(data["tuned_on"]["report_seeds"])
    # The chosen point is one of the swept grid's, with w_o fixed at 1.
    grid = data["tuned_on"]["grid"]
    for name in HYPERPARAMETERS:
        assert data["hyperparameters"][name] in grid[name]
    chosen, source = eval_autopilot.choose_ml_config(None, tuned=True)
    assert hyperparameters(chosen) == pytest.approx(data["hyperparameters"])
    assert source.startswith("shipped")
    assert eval_autopilot.choose_ml_config(None, tuned=False)[1] == "library defaults"
    # The file says which of eqs. 4-9's deviations it uses (absent: as written).
    assert set(data.get("options", {})) <= {"margin_mode", "cost_at_previous_limit", "normalise_histograms"}
