"""``cellpilot eval gpa|compaction|lava`` end to end through the real CLI app, at tiny sizes.

Each command writes ``summary.json`` with its rows named as the issues specify, a
markdown report and plots; malformed options end with a usage error naming the problem.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cellpilot.cli.main import app

GPA_TINY = ["--instances", "2", "--tasks", "60", "--realizations", "200", "--seed", "4"]
COMPACTION_TINY = ["--machines", "20", "--tasks", "80", "--seeds", "1"]
LAVA_TINY = ["--hosts", "6", "--days", "0.5", "--history-days", "0.5"]


def invoke(args: list[str]) -> Any:
    return CliRunner().invoke(app, args)


def summary_of(out: Path) -> dict[str, Any]:
    return json.loads((out / "summary.json").read_text())


def test_eval_gpa_has_a_row_per_method_and_reads_traces(tmp_path: Path) -> None:
    trace = tmp_path / "trace.txt"
    trace.write_text("\n".join(f"t{i} inst " + " ".join(["0.05", "0.1"] * 50) for i in range(40)) + "\n")
    out = tmp_path / "out"
    result = invoke(["eval", "gpa", *GPA_TINY, "--observe", "0.5", "--out", str(out), "--trace", str(trace)])
    assert result.exit_code == 0, result.output
    summary = summary_of(out)
    names = [row["method"] for row in summary["rows"]]
    # Every method of GPA §5.1: GPA at four rho, av with three factors, six percentiles, three Cantelli b.
    assert names == [
        "gpa-0.1", "gpa-0.05", "gpa-0.01", "gpa-0.001", "av-1", "av-1.25", "av-2",
        "perc-50", "perc-70", "perc-90", "perc-95", "perc-99", "perc-100",
        "cantelli-1", "cantelli-1.7", "cantelli-4.4",
    ]  # fmt: skip
    for row in summary["rows"]:
        assert row["m"] >= 0.0
        assert 0.0 <= row["q"] <= 1.0
    assert summary["settings"]["observe"] == 0.5
    assert {"gpa-0.01_q_within_30pct", "gpa-0.01_fewer_machines_than_perc-90"} <= set(summary["goals"])
    assert summary["trace"]["settings"]["tasks"] == 40  # capped at the trace's size
    for name in ("machines_vs_overflow.png", "gpa_relative_error.png", "results.md"):
        assert (out / name).stat().st_size > 0


def test_eval_compaction_reports_machines_per_policy(tmp_path: Path) -> None:
    result = invoke(["eval", "compaction", *COMPACTION_TINY, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    summary = summary_of(tmp_path)
    assert [row["policy"] for row in summary["rows"]] == ["best-fit", "worst-fit", "hybrid"]
    for row in summary["rows"]:
        assert 1 <= row["machines"] <= 20
        assert row["machines_min"] <= row["machines"] <= row["machines_max"]
    goals = {"hybrid_fewer_machines_than_best-fit", "hybrid_fewer_machines_than_worst-fit"}
    assert set(summary["goals"]) == goals
    assert (tmp_path / "machines.png").stat().st_size > 0
    assert "| policy |" in (tmp_path / "results.md").read_text()


def test_eval_lava_has_a_row_per_policy_and_predictor(tmp_path: Path) -> None:
    result = invoke(["eval", "lava", *LAVA_TINY, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    summary = summary_of(tmp_path)
    assert [row["name"] for row in summary["rows"]] == [
        "best-fit", "la-binary-model", "la-binary-oracle",
        "las-model", "las-oracle", "lava-model", "lava-oracle",
    ]  # fmt: skip
    for row in summary["rows"]:
        for key in ("empty_hosts_pct_mean", "cpu_stranding_pct", "memory_stranding_pct", "migrations"):
            assert key in row
    model = summary["model"]
    assert {"precision_7d", "recall_7d", "f1_by_uptime_quantile", "class_confusion"} <= set(model)
    assert summary["lars"]["requests"] > 0  # the separate maintenance run asked for migrations
    assert "series" not in summary  # the time series goes to its own file
    report = (tmp_path / "results.md").read_text()
    assert "Figure 9" in report
    assert "lava-oracle" in report
    for name in ("empty_hosts.png", "f1_by_uptime.png", "empty_hosts_series.json"):
        assert (tmp_path / name).stat().st_size > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["eval", "gpa", *GPA_TINY, "--observe", "1.5"], "observe"),
        (["eval", "gpa", *GPA_TINY, "--algorithm", "worst-fit"], "algorithm"),
        (["eval", "gpa", *GPA_TINY, "--instances", "0"], "instances"),
        (["eval", "gpa", *GPA_TINY, "--tasks", "many"], "tasks"),
        (["eval", "compaction", *COMPACTION_TINY, "--policies", "best-fit,first-fit"], "policies"),
        (["eval", "compaction", *COMPACTION_TINY, "--workload", "cloud"], "mix"),
        (["eval", "compaction", *COMPACTION_TINY, "--fill", "1.5"], "fill"),
        (["eval", "lava", *LAVA_TINY, "--policies", "nope"], "policies"),
        (["eval", "lava", *LAVA_TINY, "--predictor", "crystal-ball"], "predictors"),
        (["eval", "lava", *LAVA_TINY, "--trace", "google:x"], "trace"),
        (["eval", "lava", *LAVA_TINY, "--label", "median"], "median"),
        (["eval", "lava", "--hosts", "0"], "hosts"),
        (["eval", "lava", *LAVA_TINY, "--model", "neural"], "model"),
        (["eval", "lava", *LAVA_TINY, "--class-risk", "1.5"], "class_risk"),
    ],
    ids=[
        "gpa-observe", "gpa-algorithm", "gpa-instances", "gpa-not-a-number", "compaction-policy",
        "compaction-workload", "compaction-fill", "lava-policy", "lava-predictor", "lava-trace",
        "lava-label", "lava-hosts", "lava-model", "lava-class-risk",
    ],
)  # fmt: skip
def test_malformed_options_are_usage_errors(tmp_path: Path, args: list[str], message: str) -> None:
    result = invoke([*args, "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output  # click's usage error, not a traceback
    assert message in result.output
    assert not (tmp_path / "out" / "summary.json").exists()


def test_malformed_gpa_trace_names_the_line(tmp_path: Path) -> None:
    trace = tmp_path / "bad.txt"
    trace.write_text("t1 inst 0.1 0.2\nt2 inst 0.1 oops\n")
    result = invoke(["eval", "gpa", *GPA_TINY, "--trace", str(trace), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert "line 2" in result.output
