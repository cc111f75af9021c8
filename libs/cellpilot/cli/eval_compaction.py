"""``cellpilot eval compaction``: cell compaction per scoring policy (Borg §5.1)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.progress import Progress

from cellpilot.cli.output import console
from cellpilot.cli.study_command import (
    OutOption,
    WorkloadSeedOption,
    checked_options,
    comma_list,
    met_goal_rows,
)
from cellpilot.cli.study_runner import ShardPlacement, register_study
from cellpilot.evaluate.compaction import CompactionConfig, run_compaction
from cellpilot.evaluate.report import markdown_table, plot_bars, write_markdown, write_summary
from cellpilot.workloads.cell_workload import MACHINE_MIXES

COLUMNS = ("policy", "machines", "machines_min", "machines_max", "fraction_of_original", "did_not_fit")
FORMATS = {"machines": ".0f", "fraction_of_original": ".1%"}


def compaction(
    out: OutOption,
    workload: Annotated[
        str, typer.Option(help=f"synthetic workload: machine mix, one of {sorted(MACHINE_MIXES)}")
    ] = "heterogeneous",
    policies: Annotated[
        str, typer.Option(help="comma-separated packing scorers")
    ] = "best-fit,worst-fit,hybrid",
    machines: Annotated[int, typer.Option(help="machines in the original cell")] = 200,
    tasks: Annotated[int, typer.Option(help="tasks in the workload")] = 2000,
    fill: Annotated[float, typer.Option(help="workload CPU limits / original CPU capacity")] = 0.7,
    seeds: Annotated[int, typer.Option(help="trials per policy (Borg §5.1 uses 11)")] = 11,
    seed: WorkloadSeedOption = 0,
    reclamation: Annotated[bool, typer.Option(help="non-prod tasks use reservations (§5.5)")] = True,
    relaxed_randomization: Annotated[
        bool, typer.Option(help="examine a random sample of machines instead of all (§3.4)")
    ] = False,
    *,
    placement: ShardPlacement,
) -> None:
    """Removes machines until the workload no longer fits, per policy; reports the 90th percentile."""
    config = checked_options(
        lambda: CompactionConfig(
            machines=machines,
            tasks=tasks,
            fill=fill,
            mix=workload,
            workload_seed=seed,
            seeds=seeds,
            policies=comma_list(policies),
            reclaimed=reclamation,
            relaxed_randomization=relaxed_randomization,
        )
    )
    with placement.runner() as runner, Progress(console=console, transient=True) as progress:
        bars = {p: progress.add_task(f"{p}: seeds", total=seeds) for p in config.policies}
        summary = run_compaction(
            config, progress=lambda p, done: progress.update(bars[p], completed=done), runner=runner
        )
    rows = [row for row in summary["rows"] if row.get("machines") is not None]
    if rows:
        plot_bars(
            out / "machines.png",
            [row["policy"] for row in rows],
            [row["machines"] for row in rows],
            "machines (90th percentile over seeds)",
            f"Cell compaction, {workload} workload (Borg §5.1); bars: min–max",
            low=[row["machines_min"] for row in rows],
            high=[row["machines_max"] for row in rows],
        )
    table = markdown_table(summary["rows"], COLUMNS, FORMATS)
    goal_rows = met_goal_rows(summary["goals"])
    write_summary(out, summary)
    write_markdown(
        out,
        "results.md",
        f"Cell compaction (Borg §5.1): {workload} workload of {summary['settings']['tasks']} tasks",
        [table, "## Goals\n", markdown_table(goal_rows, ("goal", "met"))],
    )
    console.print(table)
    console.print(f"wrote {out / 'summary.json'}")


def register(eval_app: typer.Typer) -> None:
    register_study(eval_app, "compaction", compaction)
