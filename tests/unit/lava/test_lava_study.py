"""The LAVA study end to end on a tiny synthetic trace, and the ``cellpilot eval lava`` command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from cellpilot.cli.eval_lava import register
from cellpilot.evaluate.lava_study import StudyConfig, run_study
from cellpilot.lifetimes.model import TrainingParams

TINY = {"hosts": 8, "days": 1.0, "history_days": 1.0, "warmup_days": 0.1}


@pytest.fixture(scope="module")
def summary() -> dict:
    config = StudyConfig(**TINY, training=TrainingParams(num_trees=20))  # type: ignore[arg-type]
    return run_study(config)


def test_one_row_per_policy_and_predictor(summary: dict) -> None:
    names = [row["name"] for row in summary["rows"]]
    assert names == [
        "best-fit",
        "la-binary-model",
        "la-binary-oracle",
        "las-model",
        "las-oracle",
        "lava-model",
        "lava-oracle",
    ]
    for row in summary["rows"]:
        for key in ("empty_hosts_pct_mean", "cpu_stranding_pct", "memory_stranding_pct", "migrations"):
            assert key in row
        assert 0.0 <= row["empty_hosts_pct_mean"] <= 100.0
    baseline = summary["rows"][0]
    assert baseline["empty_hosts_over_best_fit_pp"] == 0.0


def test_model_accuracy_and_goals_are_reported(summary: dict) -> None:
    model = summary["model"]
    assert len(model["f1_by_uptime_quantile"]) == 20
    assert 0.0 <= model["precision_7d"] <= 1.0
    assert {"model: LAVA >= LAS", "oracle: LAS > LA-Binary"} <= set(summary["goals"])
    assert set(summary["series"]) == {row["name"] for row in summary["rows"]}


def test_progress_is_reported_per_run() -> None:
    seen: dict[str, float] = {}
    config = StudyConfig(**TINY, policies=("best-fit", "las"), predictors=("oracle",))  # type: ignore[arg-type]
    run_study(config, lambda label, fraction: seen.__setitem__(label, fraction))
    assert seen["best-fit"] == 1.0
    assert seen["las-oracle"] == 1.0


@pytest.mark.parametrize(
    "kwargs",
    [{"policies": ("first-fit",)}, {"predictors": ("crystal-ball",)}, {"trace": "google:x"}, {"hosts": 0}],
    ids=["policy", "predictor", "trace", "hosts"],
)
def test_config_is_validated(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        StudyConfig(**kwargs)


def test_command_writes_the_report(tmp_path: Path) -> None:
    app = typer.Typer()
    eval_app = typer.Typer()
    register(eval_app)
    app.add_typer(eval_app, name="eval")
    out = tmp_path / "report"
    args = ["eval", "lava", "--out", str(out), "--hosts", "6", "--days", "0.5", "--history-days", "0.5"]
    args += ["--policies", "best-fit,las", "--predictor", "oracle"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert [row["name"] for row in summary["rows"]] == ["best-fit", "las-oracle"]
    for name in ("results.md", "empty_hosts.png", "f1_by_uptime.png", "empty_hosts_series.json"):
        assert (out / name).stat().st_size > 0
    bad = CliRunner().invoke(app, ["eval", "lava", "--out", str(out), "--policies", "nope"])
    assert bad.exit_code != 0
