"""``cellpilot eval autopilot``: replay Autopilot's recommenders, manual limits and VPA (Autopilot §4, §5.1).

Outputs in ``--out DIR``: ``summary.json`` (one object per recommender: the §4.1.1 metrics),
``results.md`` (tables, Table 2, the goals), ``run.json`` (settings, goals, timing) and the
CDF plots of Figures 3a, 3b, 3c, 5 and 7. ``cellpilot eval autopilot-tune``
(:mod:`cellpilot.cli.eval_autopilot_tune`) runs the §3.2.3 hyperparameter sweep.
"""

from __future__ import annotations

import resource
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Annotated, NamedTuple

import numpy as np
import typer
from matplotlib import colormaps
from matplotlib.figure import Figure

from cellpilot.autopilot.ml_config import MAX_ML_CONFIG_BYTES, TUNED_FILE, load_ml_config, ml_config_from_json
from cellpilot.cli.output import console
from cellpilot.cli.study_command import (
    MeasuredDaysOption,
    OutOption,
    SyntheticJobsOption,
    WorkloadSeedOption,
    replay_progress,
)
from cellpilot.cli.study_runner import ShardPlacement, register_study
from cellpilot.cli.text_file import TextFileError, read_text_file
from cellpilot.evaluate.autopilot_deciders import parse_recommenders
from cellpilot.evaluate.autopilot_metrics import (
    CORE_KEYS,
    LIMIT_CHANGE_KEYS,
    TABLE2_ROWS,
    JobDays,
    cdf,
    table2_label,
)
from cellpilot.evaluate.autopilot_replay import ReplayConfig, StudyResult, run_study
from cellpilot.evaluate.replay_machines import CELL_MODELS, DEFAULT_CELL, CellModel
from cellpilot.evaluate.report import markdown_table, save_figure, write_markdown, write_summary
from cellpilot.recommend.ml_ensemble import EnsembleConfig
from cellpilot.traces.google import TRACES, open_google_trace
from cellpilot.workloads.autopilot_jobs import AutopilotWorkloadConfig
from cellpilot.workloads.task_signals import WINDOWS_PER_DAY, JobSignals

DEFAULT_RECOMMENDERS = "manual-hard,manual-soft,moving-window,ml,vpa,clairvoyant"
MAIN_COLUMNS = (
    "recommender",
    "relative_slack_mean",
    "relative_slack_median",
    "absolute_slack_machines",
    "absolute_slack_vs_bound",
    "slack_vs_bound",
    "footprint_machines",
    "relative_oom_rate_per_task_day",
    "oom_free_job_days_fraction",
    *LIMIT_CHANGE_KEYS,
    "job_days_without_limit_changes_fraction",
    "job_days",
)
# The breakdown tables: the main columns the breakdowns carry (CORE_KEYS and the bound ratio).
BREAKDOWN_COLUMNS = tuple(c for c in MAIN_COLUMNS if c != "job_days_without_limit_changes_fraction")
FORMATS = {
    "relative_slack_mean": ".3f",
    "relative_slack_median": ".3f",
    "absolute_slack_machines": ".1f",
    "absolute_slack_vs_bound": ".2f",
    "slack_vs_bound": ".2f",
    "footprint_machines": ".1f",
    "relative_oom_rate_per_task_day": ".4f",
    "oom_free_job_days_fraction": ".2%",
    "limit_changes_per_job_day": ".2f",
    "limit_changes_per_job_day_p50": ".1f",
    "limit_changes_per_job_day_p99": ".1f",
    "job_days_without_limit_changes_fraction": ".1%",
    "cpu_relative_slack_mean": ".3f",
    "cpu_throttled_fraction_mean": ".3%",
    "cpu_job_days_throttled_over_1pct_fraction": ".1%",
}


def load_ml_file(path: Path) -> EnsembleConfig:
    """An ML configuration file (see :mod:`cellpilot.autopilot.ml_config`); a CLI error if bad."""
    try:
        return ml_config_from_json(read_text_file(path, "JSON", MAX_ML_CONFIG_BYTES), str(path))
    except (TextFileError, ValueError) as error:
        raise typer.BadParameter(str(error), param_hint="--ml-config") from None


def choose_ml_config(path: Path | None, tuned: bool) -> tuple[EnsembleConfig, str]:
    """The ML configuration of a replay and where it came from: by default the recommender
    workers' own (the shipped tuned file)."""
    if path is not None:
        return load_ml_file(path), str(path)
    if tuned:
        return load_ml_config(), f"shipped (cellpilot/autopilot/data/{TUNED_FILE})"
    return EnsembleConfig(), "library defaults"


def _trace_jobs(spec: str, min_coverage: float) -> tuple[list[JobSignals], str]:
    """The trace's long-running jobs, chosen in the trace engine (only they reach Python)."""
    kind, _, location = spec.partition(":")
    if kind not in TRACES or not location:
        raise typer.BadParameter("--trace must be google2011:PATH or google2019:PATH")
    try:
        with (
            console.status(f"reading {kind} trace {location}"),
            open_google_trace(kind, Path(location)) as trace,
        ):
            days = trace.windows // WINDOWS_PER_DAY
            if days < 1:
                raise typer.BadParameter(f"{location}: less than one day of usage")
            jobs = [j.window_slice(0, days * WINDOWS_PER_DAY) for j in trace.jobs(min_coverage=min_coverage)]
    except (OSError, ValueError) as error:
        raise typer.BadParameter(f"{kind} trace {location}: {error}", param_hint="--trace") from error
    if not jobs:
        raise typer.BadParameter(f"{location}: no long-running jobs (min coverage {min_coverage})")
    return jobs, f"{kind} trace {location}: {len(jobs)} long-running jobs, {days} days"


def _cpu_seconds() -> float:
    """CPU seconds of this process and its finished children (a local cluster's worker processes,
    once it has shut down; a remote cluster's are not counted)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def plot_cdfs(
    path: Path,
    series: Mapping[str, Sequence[float] | np.ndarray],
    xlabel: str,
    title: str,
    *,
    log_x: bool = False,
    zoom_y: bool = False,
) -> Path:
    """Empirical CDFs, one step line per recommender; ``zoom_y`` starts the y axis near the lowest F(0)."""
    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    palette = colormaps["tab10"]
    lowest = 1.0
    for i, (label, values) in enumerate(series.items()):
        xs, ys = cdf(values, points=600)
        if not xs:
            continue
        ax.step(xs, ys, where="post", label=label, color=palette(i % 10))
        lowest = min(lowest, ys[0])
    if log_x:
        ax.set_xscale("symlog", linthresh=1e-3)
    if zoom_y:
        ax.set_ylim(max(0.0, lowest - 0.02), 1.001)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of job-days")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path, dpi=90)


def write_plots(out: Path, rows: Mapping[str, JobDays], machine_bytes: float, population: str) -> list[Path]:
    def pick(r: JobDays) -> JobDays:
        return r.select(r.serving) if population == "serving" else r

    chosen = {name: pick(r) for name, r in rows.items()}
    return [
        plot_cdfs(
            out / figure.file_name,
            {n: figure.metric(r, machine_bytes) for n, r in chosen.items()},
            figure.xlabel,
            figure.title,
            log_x=figure.log_x,
            zoom_y=figure.zoom_y,
        )
        for figure in CDF_FIGURES
    ]


class CdfFigure(NamedTuple):
    """One of the paper's CDF figures: its file, the per-job-day metric (given the machine size
    in bytes), the axis label, the title, a log x axis and a y axis zoomed near the lowest F(0)."""

    file_name: str
    metric: Callable[[JobDays, float], np.ndarray]
    xlabel: str
    title: str
    log_x: bool = False
    zoom_y: bool = False


CDF_FIGURES = (
    CdfFigure(
        "fig3a_relative_slack_cdf.png",
        lambda r, _: r.relative_slack,
        "relative slack (limit - p95 usage) / limit",
        "Figure 3a: relative slack per job-day",
    ),
    CdfFigure(
        "fig3b_absolute_slack_cdf.png",
        lambda r, machine: r.absolute_slack / machine,
        "absolute slack (machines)",
        "Figure 3b: absolute slack per job-day",
        log_x=True,
    ),
    CdfFigure(
        "fig3c_footprint_cdf.png",
        lambda r, machine: r.footprint / machine,
        "footprint (machines)",
        "Figure 3c: footprint per job-day",
        log_x=True,
    ),
    CdfFigure(
        "fig5_relative_oom_cdf.png",
        lambda r, _: r.relative_oom_rate,
        "OOMs per task-day",
        "Figure 5: relative OOMs per job-day (zoomed y axis)",
        log_x=True,
        zoom_y=True,
    ),
    CdfFigure(
        "fig7_limit_changes_cdf.png",
        lambda r, _: r.limit_changes,
        "limit changes per job-day",
        "Figure 7: limit changes per job-day (zoomed y axis)",
        zoom_y=True,
    ),
)


def _cell_label(cell: Mapping[str, float] | None) -> str:
    """`` (cell model: NAME, overcommit X)`` for a replay's cell (empty if not recorded): the
    goals hold under the cell model the study ran."""
    if not cell:
        return ""
    overcommit = float(cell["overcommit"])
    named = [n for n, m in CELL_MODELS.items() if m.overcommit == overcommit]
    return f" (cell model: {named[0] if named else 'custom'}, overcommit {overcommit:g})"


def _sections(result: StudyResult, description: str) -> list[str]:
    summaries = result.summaries
    population = result.settings["population"]
    rows = [{"recommender": name, **s} for name, s in summaries.items()]
    table2 = [
        {
            "threshold": table2_label(row),
            **{n: s["seriously_impacted_job_days"][table2_label(row)] for n, s in summaries.items()},
        }
        for row in TABLE2_ROWS
    ]
    goal_rows = [{"goal": g.name, "met": "yes" if g.met else "NO", "numbers": g.detail} for g in result.goals]
    sections = [
        f"{description}; {result.measured_days} measured days after "
        f"{result.settings['replay']['warmup_days']} warm-up days; population: {population} jobs "
        f"({result.seconds:.0f} s).\n",
        "## Metrics (§4.1.1)\n",
        markdown_table(rows, MAIN_COLUMNS, FORMATS),
        "## Job-days seriously impacted by OOMs (Table 2)\n",
        markdown_table(table2, ("threshold", *summaries)),
        f"## Goals{_cell_label(result.settings['replay'].get('cell'))}\n",
        markdown_table(goal_rows, ("goal", "met", "numbers")),
    ]
    if any("cpu_relative_slack_mean" in s for s in summaries.values()):
        cpu_cols = (
            "recommender",
            "cpu_relative_slack_mean",
            "cpu_throttled_fraction_mean",
            "cpu_job_days_throttled_over_1pct_fraction",
        )
        sections += ["## CPU\n", markdown_table(rows, cpu_cols, FORMATS)]
    breakdowns = next(iter(summaries.values())).get("breakdown", {})
    for key in breakdowns:
        sub = [{"recommender": name, **s["breakdown"][key]} for name, s in summaries.items()]
        if all(r.get("job_days", 0) == 0 for r in sub):
            continue
        sections += [
            f"## Breakdown: {key.replace('_', ' ')}\n",
            markdown_table(sub, BREAKDOWN_COLUMNS, FORMATS),
        ]
    return sections


def autopilot(
    out: OutOption,
    workload: Annotated[
        str, typer.Option(help="synthetic workload generator (ignored with --trace)")
    ] = "synthetic",
    jobs: SyntheticJobsOption = 500,
    days: MeasuredDaysOption = 14,
    seed: WorkloadSeedOption = 0,
    trace: Annotated[
        str | None, typer.Option(help="google2011:PATH or google2019:PATH (a trace directory)")
    ] = None,
    recommenders: Annotated[
        str, typer.Option(help="comma-separated; name:hard / name:soft overrides enforcement")
    ] = DEFAULT_RECOMMENDERS,
    warmup_days: Annotated[int, typer.Option(help="days replayed before measuring")] = 2,
    cpu: Annotated[bool, typer.Option(help="also replay CPU limits (throttling)")] = False,
    ml_config: Annotated[
        Path | None, typer.Option(help="ML hyperparameters JSON (default: the committed tuned configuration)")
    ] = None,
    tuned_ml: Annotated[
        bool, typer.Option(help="use the committed tuned ML hyperparameters (else the library defaults)")
    ] = True,
    population: Annotated[
        str, typer.Option(help="serving (the paper's §4.1.2 population) or all")
    ] = "serving",
    actuation_delay_minutes: Annotated[
        float, typer.Option(help="from recommendation to limit in force")
    ] = 5.0,
    min_coverage: Annotated[float, typer.Option(help="trace jobs must run in this share of windows")] = 0.9,
    cell: Annotated[
        str,
        typer.Option(
            help="how the replayed tasks share machines: none (limits reserved in full, no overcommit), "
            "borg (Borg §5.5's median cell: limits 1.25x a machine's memory) or tight (1.5x)"
        ),
    ] = DEFAULT_CELL,
    pool_jobs: Annotated[
        int, typer.Option(help="consecutive jobs whose tasks share machines (soft-limit pressure)")
    ] = CellModel.pool_jobs,
    free_memory: Annotated[
        float, typer.Option(help="share of each machine's memory no task reserves, in [0, 1]")
    ] = CellModel.free_fraction,
    *,
    placement: ShardPlacement,
) -> None:
    """Replays manual limits, Autopilot's moving window and ML recommenders and VPA (Autopilot §4)."""
    try:
        specs = parse_recommenders(recommenders)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--recommenders") from error
    if jobs < 1 or days < 1 or warmup_days < 0 or placement.workers < 1:
        raise typer.BadParameter("--jobs, --days and --workers must be >= 1, --warmup-days >= 0")
    if population not in ("serving", "all"):
        raise typer.BadParameter("--population must be 'serving' or 'all'")
    if cell not in CELL_MODELS:
        raise typer.BadParameter(f"must be one of {', '.join(CELL_MODELS)}", param_hint="--cell")
    if pool_jobs < 1:
        raise typer.BadParameter("must be >= 1", param_hint="--pool-jobs")
    if not 0.0 <= free_memory <= 1.0:
        raise typer.BadParameter("must be in [0, 1]", param_hint="--free-memory")
    ml, ml_source = choose_ml_config(ml_config, tuned_ml)
    config = ReplayConfig(
        warmup_days=warmup_days,
        actuation_delay_ms=int(actuation_delay_minutes * 60_000),
        cpu=cpu,
        ml=ml,
        cell=replace(CELL_MODELS[cell], pool_jobs=pool_jobs, free_fraction=free_memory),
    )
    source: AutopilotWorkloadConfig | list[JobSignals]
    if trace:
        source, description = _trace_jobs(trace, min_coverage)
    else:
        if workload != "synthetic":
            raise typer.BadParameter("--workload must be 'synthetic' (or give --trace)")
        source = AutopilotWorkloadConfig(jobs=jobs, days=days + warmup_days, seed=seed, with_cpu=cpu)
        description = f"synthetic workload: {jobs} jobs, seed {seed}"
    description += f"; ML hyperparameters: {ml_source}; cell: {cell} (overcommit {config.cell.overcommit:g})"
    cpu_started = _cpu_seconds()
    with (
        placement.runner() as runner,
        replay_progress() as progress,
    ):
        bar = progress.add_task("replaying job-days", total=None)
        result = run_study(
            source,
            specs,
            config,
            runner=runner,
            population=population,
            progress=lambda done, total: progress.update(bar, completed=done, total=total),
        )
    cpu_seconds = _cpu_seconds() - cpu_started
    summary = {name: {**{k: s.get(k) for k in CORE_KEYS}, **s} for name, s in result.summaries.items()}
    write_summary(out, summary)
    run_info = {
        "description": description,
        "settings": result.settings,
        "ml_config": ml_source,
        "measured_days": result.measured_days,
        "replayed_job_days": result.replayed_job_days,
        "seconds": result.seconds,
        "cpu_seconds": cpu_seconds,
        # Job-days, each replayed through every compared recommender, per wall / per CPU second.
        "job_days_per_second": result.replayed_job_days / max(result.seconds, 1e-9),
        "job_days_per_cpu_second": result.replayed_job_days / max(cpu_seconds, 1e-9),
        "goals": [{"goal": g.name, "met": g.met, "numbers": g.detail} for g in result.goals],
    }
    write_summary(out, run_info, name="run.json")
    sections = _sections(result, description)
    workload_args = (
        f"--trace {trace}" if trace else f"--workload synthetic --jobs {jobs} --days {days} --seed {seed}"
    )
    sections.insert(
        1,
        f"Reproduce: `cellpilot eval autopilot {workload_args} --recommenders {recommenders} "
        f"--warmup-days {warmup_days} --population {population} --cell {cell} --out DIR`\n",
    )
    plots = write_plots(out, result.rows, config.machine_memory_bytes, population)
    sections.append("## Plots\n\n" + "\n".join(f"![{p.stem}]({p.name})" for p in plots) + "\n")
    write_markdown(
        out, "results.md", "Autopilot replay: manual limits vs moving window vs ML vs VPA", sections
    )
    console.print(sections[3])
    console.print(sections[7])
    console.print(f"wrote {out / 'summary.json'} ({result.seconds:.0f} s, {cpu_seconds:.0f} CPU s)")


def register(eval_app: typer.Typer) -> None:
    register_study(eval_app, "autopilot", autopilot, workers=2)
