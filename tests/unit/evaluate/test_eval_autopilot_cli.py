"""End to end: `cellpilot eval autopilot` on a tiny synthetic workload and on the shipped trace samples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from cellpilot.cli import eval_autopilot
from cellpilot.evaluate.autopilot_metrics import CORE_KEYS, TABLE2_ROWS, table2_label

ROOT = Path(__file__).resolve().parents[3]
SAMPLES = ROOT / "libs" / "cellpilot" / "workloads" / "data"
RECOMMENDERS = {"manual-hard", "manual-soft", "moving-window", "ml", "vpa", "clairvoyant"}
FIGURE_PLOTS = (  # Figures 3a, 3b, 5 and 7 of the paper
    "fig3a_relative_slack_cdf",
    "fig3b_absolute_slack_cdf",
    "fig5_relative_oom_cdf",
    "fig7_limit_changes_cdf",
)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _app() -> typer.Typer:
    app = typer.Typer()
    eval_app = typer.Typer()
    eval_autopilot.register(eval_app)
    app.add_typer(eval_app, name="eval")
    return app


def _run(out: Path, *args: str) -> dict[str, dict[str, object]]:
    result = CliRunner().invoke(
        _app(), ["eval", "autopilot", "--warmup-days", "1", "--workers", "1", "--out", str(out), *args]
    )
    assert result.exit_code == 0, result.output
    summary: dict[str, dict[str, object]] = json.loads((out / "summary.json").read_text())
    return summary


def _check_outputs(out: Path, summary: dict[str, dict[str, object]], job_days: int) -> None:
    assert set(summary) == RECOMMENDERS
    for name, metrics in summary.items():
        missing = [key for key in CORE_KEYS if key not in metrics]
        assert not missing, f"{name} lacks {missing}"
        assert metrics["job_days"] == job_days
        impacted = metrics["seriously_impacted_job_days"]
        assert isinstance(impacted, dict)
        assert set(impacted) == {table2_label(row) for row in TABLE2_ROWS}
        free = metrics["oom_free_job_days_fraction"]
        assert isinstance(free, float)
        assert 0.0 <= free <= 1.0
    for plot in FIGURE_PLOTS:
        assert (out / f"{plot}.png").read_bytes()[:8] == PNG_MAGIC
    results = (out / "results.md").read_text()
    assert "| recommender | relative_slack_mean |" in results
    assert "Table 2" in results
    for plot in FIGURE_PLOTS:
        assert f"({plot}.png)" in results
    run = json.loads((out / "run.json").read_text())
    assert run["measured_days"] * len(RECOMMENDERS) > 0
    assert {g["goal"] for g in run["goals"]}


def test_a_tiny_synthetic_workload(tmp_path: Path) -> None:
    out = tmp_path / "synthetic"
    summary = _run(
        out, "--workload", "synthetic", "--jobs", "4", "--days", "1", "--seed", "3", "--population", "all"
    )
    _check_outputs(out, summary, job_days=4)  # 4 jobs x 1 measured day, batch jobs included
    run = json.loads((out / "run.json").read_text())
    assert run["replayed_job_days"] == 4 * 2
    assert run["ml_config"].startswith("shipped")


@pytest.mark.parametrize(
    ("trace", "job_days"),
    [("google2011", 2 * 2), ("google2019", 1 * 2)],  # serving jobs x two measured days
    ids=["google2011", "google2019"],
)
def test_the_shipped_trace_samples(tmp_path: Path, trace: str, job_days: int) -> None:
    out = tmp_path / trace
    summary = _run(out, "--trace", f"{trace}:{SAMPLES / f'{trace}_sample'}")
    _check_outputs(out, summary, job_days=job_days)


@pytest.mark.parametrize("cell", ["none", "tight"])
def test_a_named_cell(tmp_path: Path, cell: str) -> None:
    out = tmp_path / cell
    _run(out, "--jobs", "2", "--days", "1", "--recommenders", "manual-soft", "--cell", cell)
    run = json.loads((out / "run.json").read_text())
    expected = {"none": 1.0, "tight": 1.5}[cell]
    assert run["settings"]["replay"]["cell"]["overcommit"] == expected
    assert f"--cell {cell}" in (out / "results.md").read_text()


def test_the_library_default_ml_configuration_on_request(tmp_path: Path) -> None:
    out = tmp_path / "library"
    _run(out, "--jobs", "2", "--days", "1", "--recommenders", "ml", "--no-tuned-ml")
    assert json.loads((out / "run.json").read_text())["ml_config"] == "library defaults"


@pytest.mark.parametrize(
    "args",
    [
        ["--trace", "google2020:x"],
        ["--trace", "google2011:/no/such/trace"],
        ["--workload", "poisson"],
        ["--recommenders", "nope"],
        ["--recommenders", "ml,ml"],
        ["--population", "everyone"],
        ["--cell", "roomy"],
    ],
    ids=[
        "bad-trace-kind",
        "missing-trace",
        "bad-workload",
        "bad-recommender",
        "twice",
        "bad-population",
        "bad-cell",
    ],
)
def test_the_command_rejects_bad_options(tmp_path: Path, args: list[str]) -> None:
    result = CliRunner().invoke(_app(), ["eval", "autopilot", "--out", str(tmp_path), "--jobs", "1", *args])
    assert result.exit_code == 2, result.output
    assert not (tmp_path / "summary.json").exists()
