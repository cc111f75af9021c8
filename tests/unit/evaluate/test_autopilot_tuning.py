"""The §3.2.3 hyperparameter sweep and the committed tuned configuration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cellpilot.autopilot.ml_config import (
    config_from_hyperparameters,
    grid_description,
    hyperparameters,
    load_ml_config,
    ml_config_from_json,
    options,
)
from cellpilot.cli import eval_autopilot
from cellpilot.evaluate.autopilot_tuning import (
    HYPERPARAMETERS,
    OBJECTIVE,
    UNCONSTRAINED,
    TuningGrid,
    TuningSetup,
    choose,
    config_file_data,
    run_sweep,
    violation,
)
from cellpilot.recommend.ml_ensemble import EnsembleConfig

ROOT = Path(__file__).resolve().parents[3]
TUNED = ROOT / "libs" / "cellpilot" / "autopilot" / "data" / "ml_tuned.json"


def test_grid_fixes_w_overrun_and_covers_the_product() -> None:
    grid = TuningGrid(
        eq8=("as-written",),
        model_grids=("full",),
        cost_decay=(0.01, 0.02),
        w_underrun=(0.1,),
        limit_change_ratios=(0.0, 10.0),
        w_model_change=(0.0,),
    )
    configs = [point.config for point in grid.points()]
    assert len(configs) == 4
    assert {c.w_overrun for c in configs} == {1.0}
    assert {(c.cost_decay, c.w_limit_change) for c in configs} == {
        (0.01, 0.0),
        (0.01, 1.0),
        (0.02, 0.0),
        (0.02, 1.0),
    }


def test_the_default_grid_puts_w_limit_change_below_at_and_above_w_underrun_and_at_zero() -> None:
    points = TuningGrid().points()
    for wu in TuningGrid.w_underrun:
        changes = {p.config.w_limit_change for p in points if p.config.w_underrun == wu}
        assert 0.0 in changes
        assert any(0.0 < c < wu for c in changes)
        assert any(c == pytest.approx(wu) for c in changes)
        assert any(c > wu for c in changes)


@pytest.mark.parametrize(("mode", "at_previous"), [("as-written", False), ("previous-limit", True)])
def test_the_eq8_switch_is_the_cost_at_previous_limit_option(mode: str, at_previous: bool) -> None:
    points = TuningGrid(eq8=(mode,)).points()
    for point in points:
        assert options(point.config) == {
            "margin_mode": "additive",
            "cost_at_previous_limit": at_previous,
            "normalise_histograms": False,
        }


def test_model_grids_drop_the_long_half_lives_or_the_large_margins() -> None:
    by_name = {p.model_grid: p.config.grid for p in TuningGrid(eq8=("as-written",)).points()}
    assert by_name["full"].models == 100
    day = grid_description(by_name["short"])
    assert max(day["decay_half_lives_windows"]) <= 288.0 + 1e-6
    small = grid_description(by_name["small-margins"])
    assert max(small["margins"]) == 0.125
    both = grid_description(by_name["short+small-margins"])
    assert max(both["margins"]) == 0.125
    assert max(both["decay_half_lives_windows"]) <= 288.0 + 1e-6


def test_a_chosen_configuration_file_round_trips_options_and_grid() -> None:
    config = TuningGrid(eq8=("previous-limit",), model_grids=("short",)).points()[0].config
    again = ml_config_from_json(json.dumps(config_file_data(config)))
    assert options(again) == options(config)
    assert hyperparameters(again) == hyperparameters(config)
    assert again.grid.margins == config.grid.margins
    assert again.grid.decay_rates == pytest.approx(config.grid.decay_rates)


def _row(slack: float, oom: float, changes: float) -> dict[str, float]:
    return {
        "relative_slack_mean": slack,
        "relative_oom_rate_per_task_day": oom,
        "limit_changes_per_job_day": changes,
    }


def test_the_objective_takes_the_lowest_slack_within_the_window_s_ooms_and_twice_its_changes() -> None:
    window = _row(0.25, 0.01, 3.0)
    rows = [
        _row(0.10, 0.02, 1.0),  # lower slack, more OOMs than the window
        _row(0.12, 0.005, 7.0),  # lower slack, more than 2x the window's changes
        _row(0.20, 0.01, 6.0),  # at both bounds
        _row(0.22, 0.0, 1.0),
    ]
    rows = [r | {"violation": violation(r, window)} for r in rows]
    assert [r["violation"] == 0.0 for r in rows] == [False, False, True, True]
    assert choose(rows)["relative_slack_mean"] == 0.20


def test_without_a_qualifying_setting_the_smallest_violation_is_chosen() -> None:
    window = _row(0.25, 0.01, 3.0)
    rows = [_row(0.10, 0.05, 1.0), _row(0.30, 0.011, 1.0)]
    rows = [r | {"violation": violation(r, window)} for r in rows]
    assert all(r["violation"] > 0.0 for r in rows)
    assert choose(rows)["relative_slack_mean"] == 0.30


def test_hyperparameters_round_trip() -> None:
    config = EnsembleConfig(cost_decay=0.05, w_underrun=0.3, w_limit_change=0.2, w_model_change=0.1)
    again = config_from_hyperparameters(hyperparameters(config))
    assert hyperparameters(again) == hyperparameters(config)
    assert set(hyperparameters(config)) == set(HYPERPARAMETERS)


def test_training_and_held_out_seeds_must_differ() -> None:
    with pytest.raises(ValueError):
        TuningSetup(train_seeds=(1, 2), held_out_seeds=(2, 3))


def test_a_tiny_sweep_chooses_on_training_seeds_and_reports_on_held_out_ones() -> None:
    grid = TuningGrid(
        eq8=("as-written", "previous-limit"),
        model_grids=("short+small-margins",),
        w_underrun=(0.01,),
        limit_change_ratios=(0.0, 10.0),
    )
    setup = TuningSetup(jobs=3, days=1, warmup_days=1, train_seeds=(5,), held_out_seeds=(6,), grid=grid)
    seen: list[tuple[int, int, str]] = []
    sweep = run_sweep(setup, progress=lambda done, total, stage: seen.append((done, total, stage)))
    # Progress counts decider-job-days (3 jobs x 2 days): 1 + 4 deciders on the training seed,
    # then the chosen setting, the objective's choice without the drop rule (if another) and 4 baselines.
    held_out = len(sweep["held_out"])
    assert seen[-1][:2] == (3 * 2 * (5 + held_out), 3 * 2 * (5 + held_out))
    assert [done for done, _, _ in seen] == sorted(done for done, _, _ in seen)
    assert any(stage.startswith("held-out seed 6") for _, _, stage in seen)
    assert len(sweep["table"]) == 4
    lowering = [row for row in sweep["table"] if row["down_after_drop_h"] is not None]
    assert sweep["admissible"] == sum(row["violation"] == 0.0 for row in lowering)
    # The shipped setting is the objective's choice over the training table: among the
    # settings whose limit comes down after the probe's drop, when any does.
    chosen = choose(lowering or sweep["table"])
    assert sweep["chosen_setting"]["eq8"] == chosen["eq8"]
    assert sweep["chosen"]["hyperparameters"]["w_limit_change"] == chosen["w_limit_change"]
    assert sweep["chosen"]["options"]["cost_at_previous_limit"] == (chosen["eq8"] == "previous-limit")
    assert set(sweep["held_out"]) - {UNCONSTRAINED} == {
        "ml (chosen)",
        "moving-window",
        "vpa",
        "manual-hard",
        "manual-soft",
    }
    # Every setting is probed; the comparison is the objective's choice without the drop rule.
    assert all("down_after_drop_h" in row for row in sweep["table"])
    assert (
        sweep["unconstrained_setting"]["relative_slack_mean"] == choose(sweep["table"])["relative_slack_mean"]
    )
    assert {r["seed"] for r in sweep["held_out_per_seed"]} == {6}
    assert sweep["held_out_goals"][0]["goal"] == "ML slack < window slack"
    assert sweep["objective"] == OBJECTIVE


def test_the_committed_tuned_configuration_loads_and_is_the_default() -> None:
    assert TUNED.exists(), "run `cellpilot eval autopilot-tune` and commit its output"
    config = load_ml_config(TUNED)
    shipped = load_ml_config()  # what the workers load
    assert hyperparameters(shipped) == hyperparameters(config)
    assert options(shipped) == options(config)
    assert shipped.grid == config.grid
    data = json.loads(TUNED.read_text())
    assert hyperparameters(config) == pytest.approx(data["hyperparameters"])
    assert set(data["tuned_on"]["train_seeds"]).isdisjoint(data["tuned_on"]["held_out_seeds"])
    # The chosen point is one of the swept grid's, with w_o fixed at 1.
    grid = data["tuned_on"]["grid"]
    setting = data["chosen_setting"]
    for name in HYPERPARAMETERS:
        if name != "w_limit_change":
            assert data["hyperparameters"][name] in grid[name]
    assert setting["w_limit_change_over_w_underrun"] in grid["w_limit_change_over_w_underrun"]
    assert setting["eq8"] in grid["eq8"]
    assert setting["model_grid"] in grid["model_grids"]
    assert data["options"]["cost_at_previous_limit"] == grid["eq8"][setting["eq8"]]["cost_at_previous_limit"]
    chosen, source = eval_autopilot.choose_ml_config(None, tuned=True)
    assert hyperparameters(chosen) == pytest.approx(data["hyperparameters"])
    assert source.startswith("shipped")
    assert eval_autopilot.choose_ml_config(None, tuned=False)[1] == "library defaults"
    # The file says which of eqs. 4-9's deviations it uses (absent: as written).
    assert set(data.get("options", {})) <= {"margin_mode", "cost_at_previous_limit", "normalise_histograms"}
