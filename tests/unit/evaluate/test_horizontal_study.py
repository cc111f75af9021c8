"""The horizontal study: metrics on a hand-made series, the clairvoyant bound, a tiny replay
through the real CLI, and its option validation."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from cellpilot.cli.main import app
from cellpilot.evaluate.horizontal_config import HorizontalStudyConfig, SweepGrid, Workload
from cellpilot.evaluate.horizontal_deciders import autopilot_config, bound_count, demand_outlook, hpa_config
from cellpilot.evaluate.horizontal_metrics import series_metrics
from cellpilot.evaluate.horizontal_study import replay, replay_metrics
from cellpilot.world.job_demand import DemandError, DemandSeries, JobDemand


def test_metrics_of_a_hand_made_series() -> None:
    # Six 60 s samples; the step to 2500 millicores happens at 120 s; limit 1000 per task.
    seconds = [0, 60, 120, 180, 240, 300]
    running = [2, 2, 3, 3, 3, 3]
    ready = [2, 2, 2, 2, 3, 3]
    served = [1000, 1000, 2000, 2000, 2500, 2500]
    unmet = [0, 0, 500, 500, 0, 0]
    m = series_metrics(seconds, 60, running, ready, served, unmet, 1000.0, changes=1,
                       step_at_s=120, step_level_millicores=2500)  # fmt: skip
    assert m["task_hours"] == pytest.approx(16 * 60 / 3600)
    assert m["overloaded_minutes"] == pytest.approx(2.0)
    assert m["unmet_cpu_seconds"] == pytest.approx(2 * 500 * 60 / 1000)
    assert m["changes_per_day"] == pytest.approx(1 / (360 / 86_400))
    assert m["mean_utilisation"] == pytest.approx(11000 / 14000)
    assert m["time_to_follow_s"] == 120.0  # 3 ready tasks (3000 >= 2500) from 240 s
    never = series_metrics(seconds, 60, running, ready, served, unmet, 1000.0, 0, 120, 5000)
    assert never["time_to_follow_s"] is None
    with pytest.raises(ValueError, match="one value per sample"):
        series_metrics(seconds[:-1], 60, running, ready, served, unmet, 1000.0, 0)


def _trace(points: list[float], step: float = 60.0) -> Workload:
    return Workload("t", trace=DemandSeries(step, np.asarray(points), np.zeros(0)))


def test_bound_covers_the_next_step_and_the_start_up_ahead() -> None:
    config = HorizontalStudyConfig(days=0.01, seeds=1, step_s=60, sample_s=30, startup_s=120,
                                   target_utilisation=0.5, workloads=(_trace([1000.0] * 10),))  # fmt: skip
    # Need per 60 s point at r* = 0.5 of 1000: 2, 2, 8, 2, ...: the 8 is within reach of t = 0
    # (start-up 120 s + one step 60 s ahead), not of t = 180 s.
    demand = JobDemand.build(
        trace=DemandSeries(60.0, np.array([1000.0, 1000.0, 4000.0] + [1000.0] * 20), np.zeros(0))
    )
    outlook = demand_outlook(config, demand)
    assert bound_count(config, outlook, 0) == 8
    assert bound_count(config, outlook, 120) == 8
    assert bound_count(config, outlook, 180) == 2


def test_bound_and_fixed_peak_never_overload_while_a_fixed_mean_does() -> None:
    points = [2000.0] * 20 + [9000.0] * 10 + [2000.0] * 30  # a 10-minute burst
    config = HorizontalStudyConfig(days=60 * 60 / 86_400, seeds=1, step_s=60, sample_s=30, startup_s=120,
                                   target_utilisation=0.6, workloads=(_trace(points),))  # fmt: skip
    workload = config.workloads[0]
    bound = replay_metrics(config, workload, replay(config, workload, "bound", 0))
    peak = replay_metrics(config, workload, replay(config, workload, "fixed-peak", 0))
    mean = replay_metrics(config, workload, replay(config, workload, "fixed-mean", 0))
    assert bound["overloaded_minutes"] == 0.0
    assert peak["overloaded_minutes"] == 0.0
    assert bound["task_hours"] < peak["task_hours"]
    assert mean["overloaded_minutes"] > 0.0
    assert mean["unmet_cpu_seconds"] > 0.0


def test_demand_csv_reads_seconds_or_a_given_step_and_names_bad_lines() -> None:
    series = DemandSeries.from_csv_lines(["# comment", "seconds,cpu_millicores", "0,100", "300,200"])
    assert series.step_seconds == 300.0
    assert series.cpu_millicores.tolist() == [100.0, 200.0]
    assert DemandSeries.from_csv_lines(["cpu_millicores", "5", "6"], 60.0).step_seconds == 60.0
    with pytest.raises(DemandError, match="line 3: cpu_millicores 'x' is not a number"):
        DemandSeries.from_csv_lines(["cpu_millicores", "5", "x"], 60.0)
    with pytest.raises(DemandError, match="equal steps"):
        DemandSeries.from_csv_lines(["seconds,cpu_millicores", "0,1", "10,1", "30,1"])
    with pytest.raises(DemandError, match="header"):
        DemandSeries.from_csv_lines(["cpu,memory", "1,2"], 60.0)


def test_eval_horizontal_end_to_end_on_a_tiny_horizon(tmp_path: Path) -> None:
    trace = tmp_path / "job.csv"
    trace.write_text(
        "seconds,cpu_millicores\n" + "".join(f"{i * 300},{3000 + 2000 * (i % 4)}\n" for i in range(24))
    )
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["eval", "horizontal", "--days", "0.1", "--seeds", "1", "--step", "300",
                                      "--sample", "60", "--workloads", "step", "--trace", str(trace),
                                      "--hpa-targets", "0.5,0.6", "--hpa-windows", "300",
                                      "--autopilot-targets", "0.6,0.8", "--autopilot-horizons", "1",
                                      "--autopilot-deferrals", "0.5,48", "--out", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "horizontal.json").read_text())
    defaults = [r for r in summary["rows"] if r["default"]]
    assert sorted((r["workload"], r["decider"]) for r in defaults) == sorted(
        (w, d) for w in ("step", "trace:job")
        for d in ("autopilot-cpu", "autopilot-target-size", "hpa", "bound", "fixed-peak", "fixed-mean")
    )  # fmt: skip
    # Per workload: the HPA at its default (0.6, 300 s) and 0.5; Autopilot at its default
    # (0.6, 72 h, 48 h) and the 2 x 1 x 2 grid.
    swept = [
        r for r in summary["rows"] if r["workload"] == "step" and r["decider"] in ("hpa", "autopilot-cpu")
    ]
    assert len(swept) == 2 + 5
    assert {r["decider"]: r["setting"] for r in defaults if r["workload"] == "step"}["hpa"] == {
        "target_utilisation": 0.6, "downscale_window_s": 300.0
    }  # fmt: skip
    assert all({"workload", "decider", "setting", "task_hours", "overloaded_minutes"} <= r.keys()
               for r in summary["rows"])  # fmt: skip
    assert [w["workload"] for w in summary["frontier"]["workloads"]] == ["step", "trace:job"]
    assert (out / "horizontal_frontier_step.png").stat().st_size > 0
    assert "## Autopilot against the HPA's frontier (the goal)" in (out / "horizontal.md").read_text()
    command = (out / "horizontal.md").read_text()
    assert "--workloads step --trace" in command
    assert "--autopilot-deferrals 0.5,48 --out DIR" in command
    # The goal is the frontier check's, one row per workload, met exactly when it covers every point.
    assert [(g["workload"], g["met"]) for g in summary["goals"]] == [
        (w["workload"], w["met"]) for w in summary["frontier"]["workloads"]
    ]
    assert all(g["goal"].startswith("every HPA frontier point covered") for g in summary["goals"])
    assert all(r["overloaded_minutes"] == 0 for r in summary["rows"] if r["decider"] == "bound")
    assert "## Goals (the frontier check above, per workload)" in (out / "horizontal.md").read_text()
    assert (out / "horizontal_step.png").stat().st_size > 0
    assert (out / "horizontal_trace_job.png").exists()


def test_settings_put_the_default_first_and_never_twice() -> None:
    grid = SweepGrid(hpa_targets=(0.6, 0.8), hpa_windows_s=(300.0,), autopilot_targets=(0.6,),
                     autopilot_horizons_h=(72.0,), autopilot_deferrals_h=(48.0, 1.0))  # fmt: skip
    config = HorizontalStudyConfig(days=1.0, seeds=1, target_utilisation=0.6, sweep=grid)
    assert config.settings("hpa") == [
        (("target_utilisation", 0.6), ("downscale_window_s", 300.0)),
        (("target_utilisation", 0.8), ("downscale_window_s", 300.0)),
    ]
    assert config.settings("autopilot-cpu") == [
        (("target_utilisation", 0.6), ("horizon_h", 72.0), ("deferral_h", 48.0)),
        (("target_utilisation", 0.6), ("horizon_h", 72.0), ("deferral_h", 1.0)),
    ]
    assert config.settings("bound") == [(("target_utilisation", 0.6),)]
    assert HorizontalStudyConfig(days=1.0, seeds=1).settings("hpa") == [config.default_setting("hpa")]


def test_a_setting_reaches_the_deciders_knobs() -> None:
    config = HorizontalStudyConfig(days=1.0, seeds=1)
    hpa = hpa_config(config, (("target_utilisation", 0.8), ("downscale_window_s", 1800.0)))
    assert (hpa.target_utilisation, hpa.downscale_window_s) == (0.8, 1800.0)
    assert hpa_config(config).downscale_window_s == 300.0
    autopilot = autopilot_config({"horizon_h": 0.5, "deferral_h": 0.25})
    assert (autopilot.horizon_ms, autopilot.deferred_downscaling_ms) == (1_800_000, 900_000)


def test_short_horizon_and_deferral_let_autopilot_follow_a_falling_load() -> None:
    # 1 h at 12 cores, then 3 h at 2: the defaults (72 h, 48 h) keep the peak's tasks;
    # a 30-minute horizon and 15-minute deferral let the count decay towards the low load.
    points = [12000.0] * 12 + [2000.0] * 36
    config = HorizontalStudyConfig(days=4 * 3600 / 86_400, seeds=1, step_s=60, sample_s=60, startup_s=120,
                                   target_utilisation=0.6, workloads=(_trace(points, 300.0),))  # fmt: skip
    workload = config.workloads[0]
    short = (("target_utilisation", 0.6), ("horizon_h", 0.5), ("deferral_h", 0.25))
    default = replay(config, workload, "autopilot-cpu", 0)
    follows = replay(config, workload, "autopilot-cpu", 0, short)
    assert default.decisions[-1] >= 20  # 12 cores at r* = 0.6: 20 tasks, kept
    assert follows.decisions[-1] <= 6  # 2 cores at 0.6: 4 tasks, within the 10 % dead band and decay
    assert (
        replay_metrics(config, workload, follows)["task_hours"]
        < replay_metrics(config, workload, default)["task_hours"]
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--days", "0"], "--days must be in (0, 60]"),
        (["--seeds", "0"], "--seeds must be in 1..100"),
        (["--step", "60", "--sample", "45"], "--sample must be 1..step seconds and divide the step"),
        (["--workloads", "nope"], "--workloads: unknown nope"),
        (["--hpa-targets", "0.5,1.5"], "--hpa-targets must be a non-empty list of values in (0, 1]"),
        (["--autopilot-deferrals", "0"], "--autopilot-deferrals must be a non-empty list"),
        (["--hpa-windows", "x"], "Invalid value for --hpa-windows: 'x' is not a"),
    ],
)
def test_bad_options_end_with_one_line_naming_them(tmp_path: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["eval", "horizontal", *args, "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())
