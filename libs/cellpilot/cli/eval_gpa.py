"""``cellpilot eval gpa``: the Monte Carlo experiment of GPA §5 (m and q per method)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.progress import Progress

from cellpilot.cli.output import console
from cellpilot.cli.study_command import OutOption, checked_options, met_goal_rows, read_trace
from cellpilot.cli.study_runner import ShardPlacement, register_study
from cellpilot.evaluate.gpa_study import GpaStudyConfig, run_study
from cellpilot.evaluate.report import markdown_table, plot_bars, plot_scatter, write_markdown, write_summary
from cellpilot.evaluate.sharding import ShardRunner
from cellpilot.workloads.gpa_tasks import read_gpa_trace

MAX_TRACE_BYTES = 256 << 20  # a trace is read into memory whole
COLUMNS = ("method", "m", "m_std", "m_abs", "q", "q_std", "q_relative_error")
FORMATS = {"m": ".3f", "m_std": ".3f", "m_abs": ".1f", "q": ".3g", "q_std": ".2g", "q_relative_error": "+.1%"}


def _run(
    config: GpaStudyConfig, label: str, runner: ShardRunner, pool: np.ndarray | None = None
) -> dict[str, Any]:
    with Progress(console=console, transient=True) as progress:
        bar = progress.add_task(f"{label}: instances", total=config.instances)
        return run_study(
            config, pool, progress=lambda done: progress.update(bar, completed=done), runner=runner
        )


def _report(summary: dict[str, Any], out: Path, prefix: str = "") -> list[str]:
    rows = summary["rows"]
    series = {row["method"]: (row["m_per_instance"], row["q_per_instance"]) for row in rows}
    plot_scatter(
        out / f"{prefix}machines_vs_overflow.png",
        series,
        "normalised machines m",
        "overflow frequency q",
        "GPA §5: machines vs capacity violations (one dot per instance)",
        log_y=True,
    )
    gpa_rows = [row for row in rows if row["kind"] == "gpa"]
    if gpa_rows:
        plot_bars(
            out / f"{prefix}gpa_relative_error.png",
            [row["method"] for row in gpa_rows],
            [row["q_relative_error"] for row in gpa_rows],
            "(q - rho) / rho",
            "GPA: measured overflow vs requested rho",
        )
    goal_rows = met_goal_rows(summary["goals"])
    return [markdown_table(rows, COLUMNS, FORMATS), "## Goals\n", markdown_table(goal_rows, ("goal", "met"))]


def gpa(
    out: OutOption,
    instances: Annotated[int, typer.Option(help="instances (GPA §5.1 uses 50)")] = 50,
    tasks: Annotated[int, typer.Option(help="tasks per instance (GPA §5.1 uses 1000)")] = 1000,
    observe: Annotated[
        float, typer.Option(help="clairvoyance: fraction of realisations observed; 1 = full")
    ] = 1.0,
    seed: Annotated[int, typer.Option(help="random seed")] = 0,
    realizations: Annotated[int, typer.Option(help="realisations per task (GPA uses 10 000)")] = 10_000,
    algorithm: Annotated[str, typer.Option(help="best-fit or first-fit")] = "best-fit",
    rebalance: Annotated[bool, typer.Option(help="round-robin rebalancing of the last machine (§4)")] = True,
    trace: Annotated[
        list[Path] | None, typer.Option(help="GPA trace file(s) to study as well (repeatable)")
    ] = None,
    *,
    placement: ShardPlacement,
) -> None:
    """Runs GPA §5's Monte Carlo experiment on synthetic tasks (and on trace files if given)."""
    config = checked_options(
        lambda: GpaStudyConfig(
            instances=instances,
            tasks=tasks,
            realizations=realizations,
            observe=observe,
            seed=seed,
            algorithm=algorithm,
            rebalance=rebalance,
        )
    )
    parsed = None
    if trace:
        lines: list[str] = []
        for path in trace:
            lines.extend(read_trace(path, "trace", MAX_TRACE_BYTES).splitlines())
        try:
            parsed = read_gpa_trace(lines)
        except ValueError as err:
            raise typer.BadParameter(str(err), param_hint="--trace") from err
    with placement.runner() as runner:
        summary = _run(config, "synthetic", runner)
        if trace and parsed is not None:
            trace_config = GpaStudyConfig(
                instances=instances,
                tasks=min(tasks, parsed.inst.shape[0]),
                realizations=parsed.inst.shape[1],
                observe=observe,
                seed=seed,
                algorithm=algorithm,
                rebalance=rebalance,
            )
            summary["trace"] = _run(trace_config, "trace", runner, parsed.inst)
    sections = ["## Synthetic tasks (GPA §3.5 shapes)\n", *_report(summary, out)]
    if trace and parsed is not None:
        summary["trace"]["settings"]["files"] = [str(p) for p in trace]
        sections += ["## Trace tasks\n", *_report(summary["trace"], out, prefix="trace_")]
    write_summary(out, summary)
    write_markdown(out, "results.md", "GPA Monte Carlo study (GPA §5)", sections)
    console.print(sections[1])
    console.print(f"wrote {out / 'summary.json'}")


def register(eval_app: typer.Typer) -> None:
    register_study(eval_app, "gpa", gpa)
