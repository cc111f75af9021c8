"""The LAVA study end to end on a tiny synthetic trace (the command is tested in test_eval_cli.py)."""

from __future__ import annotations

import pytest

from cellpilot.evaluate.lava_study import StudyConfig, run_study
from cellpilot.lifetimes.model import TrainingParams

TINY = {"hosts": 8, "days": 1.0, "history_days": 1.0, "warmup_days": 0.1}


@pytest.fixture(scope="module")
def summary() -> dict:
    config = StudyConfig(**TINY, training=TrainingParams(num_trees=20))  # type: ignore[arg-type]
    # (the default model is the distribution model; TrainingParams is the point model's)
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


def test_the_distribution_model_is_the_default_and_reports_calibration(summary: dict) -> None:
    assert summary["settings"]["model"] == "distribution"
    calibration = summary["model"]["calibration"]
    assert calibration[0]["uptime_hours"] == 0.0
    assert 0.0 <= calibration[0]["coverage_q0.9"] <= 1.0
    lava = next(row for row in summary["rows"] if row["name"] == "lava-model")
    assert "occupied_pp_by_reason" in lava["diagnostics"]


@pytest.mark.parametrize(("trace", "model"), [("synthetic-shifted", "distribution"), ("synthetic", "point")])
def test_held_out_population_and_point_model(trace: str, model: str) -> None:
    config = StudyConfig(
        **TINY,  # type: ignore[arg-type]
        trace=trace,
        model=model,
        policies=("best-fit", "lava"),
        predictors=("model",),
        training=TrainingParams(num_trees=20),
    )
    out = run_study(config)
    assert [row["name"] for row in out["rows"]] == ["best-fit", "lava-model"]
    assert out["settings"]["model"] == model
    assert ("coverage_q0.5" in out["model"]["calibration"][0]) == (model == "distribution")


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
    [
        {"policies": ("first-fit",)},
        {"predictors": ("crystal-ball",)},
        {"trace": "google:x"},
        {"hosts": 0},
        {"model": "neural"},
        {"class_risk": 1.0},
    ],
    ids=["policy", "predictor", "trace", "hosts", "model", "class-risk"],
)
def test_config_is_validated(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        StudyConfig(**kwargs)


def test_lars_replays_its_own_maintenance_run(summary: dict) -> None:
    # §6.1's policy runs replay creations and exits (defragmentation only); §6.3's LARS
    # comparison comes from a separate best-fit run with rolling maintenance drains.
    assert summary["settings"]["maintenance_every_hours"] == 0.0
    assert summary["settings"]["lars_maintenance_every_hours"] == 6.0
    lars = summary["lars"]
    assert "maintenance" in lars["source_run"]
    assert lars["requests"] > 0
    assert lars["lars_oracle"] <= lars["trace_order"] <= lars["requests"]
