"""The §3.2.3 hyperparameter sweep, the tuned configuration file, and `cellpilot eval autopilot`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from cellpilot.cli import eval_autopilot
from cellpilot.evaluate.autopilot_tuning import (
    HYPERPARAMETERS,
    TuningGrid,
    TuningSetup,
    config_from_hyperparameters,
    hyperparameters,
    run_sweep,
)
from cellpilot.recommend.ml_ensemble import EnsembleConfig

ROOT = Path(__file__).resolve().parents[3]
TUNED = ROOT / "libs" / "cellpilot" / "evaluate" / "data" / "ml_tuned.json"
SAMPLE_2011 = ROOT / "libs" / "cellpilot" / "workloads" / "data" / "google2011_sample"


def test_grid_fixes_w_overrun_and_covers_the_product() -> None:
    grid = TuningGrid(
        cost_decay=(0.01, 0.02), w_underrun=(0.1,), w_limit_change=(0.01, 0.1), w_model_change=(0.0,)
    )
    configs = grid.configs()
    assert len(configs) == 4
    assert {c.w_overrun for c in configs} == {1.0}
    assert {(c.cost_decay, c.w_limit_change) for c in configs} == {
        (0.01, 0.01),
        (0.01, 0.1),
        (0.02, 0.01),
        (0.02, 0.1),
    }


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
        cost_decay=(0.01,), w_underrun=(0.02, 0.4), w_limit_change=(0.01,), w_model_change=(0.01,)
    )
    setup = TuningSetup(jobs=3, days=1, warmup_days=1, tune_seeds=(5,), report_seeds=(6,), grid=grid)
    seen: list[tuple[int, int]] = []
    sweep = run_sweep(setup, progress=lambda done, total: seen.append((done, total)))
    assert seen[-1][0] == seen[-1][1] == 1 + 2 + 4  # baseline + 2 configs + 4 report replays
    assert sweep["chosen"]["w_underrun"] in (0.02, 0.4)
    assert len(sweep["table"]) == 2
    assert sweep["admissible"] == sum(row["violation"] == 0.0 for row in sweep["table"])
    assert set(sweep["report"]) == {"tuned", "default", "moving-window", "vpa"}
    # Admissible rows never do worse than the moving window on the tuning seeds.
    base = sweep["tune_baseline_moving_window"]
    for row in sweep["table"]:
        if row["violation"] == 0.0:
            assert row["relative_oom_rate_per_task_day"] <= base["relative_oom_rate_per_task_day"]


def test_the_committed_tuned_configuration_loads() -> None:
    if not TUNED.exists():
        pytest.skip("no tuned configuration committed yet")
    config = eval_autopilot.load_ml_config(TUNED)
    data = json.loads(TUNED.read_text())
    assert hyperparameters(config) == pytest.approx(data["hyperparameters"])
    assert set(data["tuned_on"]["tune_seeds"]).isdisjoint(data["tuned_on"]["report_seeds"])


def _app() -> typer.Typer:
    app = typer.Typer()
    eval_app = typer.Typer()
    eval_autopilot.register(eval_app)
    app.add_typer(eval_app, name="eval")
    return app


def test_the_command_writes_summary_markdown_and_plots(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(
        _app(),
        [
            "eval",
            "autopilot",
            "--trace",
            f"google2011:{SAMPLE_2011}",
            "--warmup-days",
            "1",
            "--workers",
            "1",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) == {"manual-hard", "manual-soft", "moving-window", "ml", "vpa"}
    for metrics in summary.values():
        for key in eval_autopilot.SUMMARY_KEYS:
            assert key in metrics
        assert metrics["job_days"] == 4  # two serving jobs x two measured days
    for plot in (
        "fig3a_relative_slack_cdf",
        "fig3b_absolute_slack_cdf",
        "fig5_relative_oom_cdf",
        "fig7_limit_changes_cdf",
    ):
        assert (out / f"{plot}.png").stat().st_size > 0
    assert "Table 2" in (out / "results.md").read_text()


@pytest.mark.parametrize(
    "args",
    [["--trace", "google2020:x"], ["--workload", "poisson"], ["--recommenders", "nope"]],
    ids=["bad-trace", "bad-workload", "bad-recommender"],
)
def test_the_command_rejects_bad_options(tmp_path: Path, args: list[str]) -> None:
    result = CliRunner().invoke(_app(), ["eval", "autopilot", "--out", str(tmp_path), "--jobs", "1", *args])
    assert result.exit_code != 0
