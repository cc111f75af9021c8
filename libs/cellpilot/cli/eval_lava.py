"""``cellpilot eval lava``: LA-Binary, LAS and LAVA against best fit (LAVA paper §5-§6).

Writes ``DIR/summary.json`` (one row per policy x predictor: ``best-fit``,
``las-model``, ``lava-oracle``, ...), ``DIR/results.md`` (tables and goals),
``DIR/empty_hosts.png`` (empty hosts over time), ``DIR/f1_by_uptime.png`` (Figure 9)
and ``DIR/empty_hosts_series.json`` (the plotted samples).
"""

from __future__ import annotations

import gzip
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from cellpilot.cli.output import console
from cellpilot.cli.study_command import (
    OutOption,
    ReplayDaysOption,
    checked_options,
    comma_list,
    met_goal_rows,
    replay_progress,
)
from cellpilot.cli.study_runner import ShardPlacement, register_study
from cellpilot.cli.text_file import TextFileError, check_readable_file, check_text_file
from cellpilot.evaluate.lava_simulator import DrainConfig
from cellpilot.evaluate.lava_study import PREDICTORS, StudyConfig, run_study
from cellpilot.evaluate.report import markdown_table, write_markdown, write_summary
from cellpilot.lifetimes.distribution_model import DistributionParams
from cellpilot.lifetimes.model import LabelTransform, TrainingParams
from cellpilot.lifetimes.predictors import DEFAULT_CLASS_RISK
from cellpilot.lifetimes.vm_table import HOUR, VmTrace
from cellpilot.schedule.lifetime_aware.policies import BASELINE, placement_names
from cellpilot.traces.azure import read_azure_vm_table

COLUMNS = (
    "name",
    "empty_hosts_pct_mean",
    "empty_hosts_over_best_fit_pp",
    "cpu_stranding_pct",
    "memory_stranding_pct",
    "migrations",
    "migration_requests",
    "failed_placements",
)
FORMATS = {
    "empty_hosts_pct_mean": ".2f",
    "empty_hosts_over_best_fit_pp": "+.2f",
    "cpu_stranding_pct": ".2f",
    "memory_stranding_pct": ".2f",
}
HEADERS = {
    "name": "run",
    "empty_hosts_pct_mean": "empty hosts %",
    "empty_hosts_over_best_fit_pp": "vs best fit (pp)",
    "cpu_stranding_pct": "CPU stranded %",
    "memory_stranding_pct": "memory stranded %",
    "migrations": "migrations",
    "migration_requests": "requested",
    "failed_placements": "failed",
}


def _split(text: str, known: Sequence[str], what: str) -> tuple[str, ...]:
    items = comma_list(text)
    bad = [item for item in items if item not in known]
    if bad or not items:
        raise typer.BadParameter(f"unknown {what} {bad}; choose from {', '.join(known)}")
    return items


def plot_lines(path: Path, series: Mapping[str, tuple[Sequence[float], Sequence[float]]], xlabel: str,
               ylabel: str, title: str) -> Path:  # fmt: skip
    """One line per label (report.py has bars and scatter plots; a time series needs lines)."""
    fig = Figure(figsize=(9, 5))
    ax = fig.add_subplot()
    for label, (xs, ys) in series.items():
        ax.plot(list(xs), list(ys), label=label, linewidth=1.2 if label == BASELINE else 0.9)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path


DIAGNOSTIC_COLUMNS = (
    "name",
    "lost_empty_pp_total",
    "underpredicted_share",
    "overstay_hours_median",
    "overstay_hours_p90",
    "class_up_per_host_day",
    "class_down_per_host_day",
    "occupied_by_underpredicted_pp",
)


def diagnostics_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """One line per run with a predictor: the misprediction figures of the replay diagnostics."""
    out = []
    for row in rows:
        d = row.get("diagnostics") or {}
        if not row.get("predictor") or not d:
            continue
        placed = sum(sum(r) for r in d["class_confusion_at_placement"])
        changes = d.get("host_class_changes_per_host_day", {})
        out.append(
            {
                "name": row["name"],
                "lost_empty_pp_total": d["lost_empty_pp_total"],
                "underpredicted_share": d["underpredicted_vms"] / placed if placed else 0.0,
                "overstay_hours_median": d["overstay_hours_median"],
                "overstay_hours_p90": d["overstay_hours_p90"],
                "class_up_per_host_day": changes.get("up", float("nan")),
                "class_down_per_host_day": changes.get("down", float("nan")),
                "occupied_by_underpredicted_pp": sum(
                    v["class_under"] for v in d["occupied_pp_by_reason"].values()
                ),
            }
        )
    formats = dict.fromkeys(DIAGNOSTIC_COLUMNS[1:], ".3f")
    return markdown_table(out, DIAGNOSTIC_COLUMNS, formats)


def write_report(summary: dict[str, Any], out: Path) -> list[str]:
    """Writes every file of the report; returns the markdown sections."""
    series = summary.pop("series")
    write_summary(out, series, "empty_hosts_series.json")
    write_summary(out, summary)
    plot_lines(
        out / "empty_hosts.png",
        {name: (s["t_days"], s["empty_pct"]) for name, s in series.items()},
        "time (days)",
        "empty hosts (% of pool)",
        f"Empty hosts over time ({summary['settings']['trace']}, {summary['settings']['hosts']} hosts)",
    )
    model = summary["model"]
    if model.get("f1_by_uptime_quantile"):
        f1 = model["f1_by_uptime_quantile"]
        plot_lines(
            out / "f1_by_uptime.png",
            {"7-day split": (list(range(len(f1))), f1)},
            f"uptime quantile (uptime = q/{len(f1)} of lifetime)",
            "F1",
            "Repredictions with uptime (LAVA Figure 9)",
        )
    model_rows = [
        {"metric": key, "value": value}
        for key, value in model.items()
        if key != "f1_by_uptime_quantile" and not isinstance(value, list | dict)
    ]
    sections = [
        "## Policies (empty hosts, stranding, migrations)\n",
        markdown_table(summary["rows"], COLUMNS, FORMATS, HEADERS),
        "## Lifetime model (§3, §6.4, §6.5)\n",
        markdown_table(model_rows, ("metric", "value")),
    ]
    if model.get("f1_by_uptime_quantile"):
        f1 = model["f1_by_uptime_quantile"]
        f1_rows = [
            {"uptime / lifetime": f"{q / len(f1):.2f}", "F1 (7-day split)": v} for q, v in enumerate(f1)
        ]
        sections += [
            "### F1 of the 7-day split by uptime quantile (Figure 9)\n",
            markdown_table(f1_rows, ("uptime / lifetime", "F1 (7-day split)"), {"F1 (7-day split)": ".3f"}),
        ]
    if model.get("class_confusion"):
        names = ("<1 h", "1-10 h", "10-100 h", ">=100 h")
        confusion_rows = [
            {"true class": names[i], **{names[j]: n for j, n in enumerate(row)}}
            for i, row in enumerate(model["class_confusion"])
        ]
        sections += [
            "### LAVA lifetime classes (§4.3): true (rows) vs predicted at creation (columns), VMs\n",
            markdown_table(confusion_rows, ("true class", *names)),
        ]
    if model.get("calibration"):
        cal = model["calibration"]
        keys = [k for k in cal[0] if k not in ("uptime_hours", "vms")]
        sections += [
            "### Calibration by uptime: LAVA class probabilities and quantile coverage (§3)\n",
            markdown_table(cal, ("uptime_hours", "vms", *keys), dict.fromkeys(keys, ".3f")),
        ]
    sections += ["## Why: diagnostics per run (see lava_diagnostics)\n", diagnostics_table(summary["rows"])]
    if summary["lars"]:
        lars_rows = [{"key": k, "value": v} for k, v in summary["lars"].items()]
        sections += ["## LARS migration order (§6.3, Table 2)\n", markdown_table(lars_rows, ("key", "value"))]
    goal_rows = met_goal_rows(summary["goals"])
    sections += ["## Goals\n", markdown_table(goal_rows, ("goal", "met", "detail"))]
    trace_rows = [{"statistic": k, "value": v} for k, v in summary["trace"].items()]
    sections += ["## Trace (§2.1, Figure 2)\n", markdown_table(trace_rows, ("statistic", "value"))]
    write_markdown(out, "results.md", "Lifetime-aware VM allocation (LAVA paper)", sections)
    return sections


def lava(
    out: OutOption = Path("lava-report"),
    trace: Annotated[
        str,
        typer.Option(
            help="'synthetic', 'synthetic-shifted' (a held-out population) or 'azure:PATH' (vmtable.csv[.gz])"
        ),
    ] = "synthetic",
    hosts: Annotated[int, typer.Option(help="hosts in the pool")] = 100,
    days: ReplayDaysOption = 14.0,
    seed: Annotated[int, typer.Option(help="random seed (trace, history, inflation)")] = 0,
    policies: Annotated[str, typer.Option(help="comma-separated: " + ",".join(placement_names()))] = ",".join(
        placement_names()
    ),
    predictor: Annotated[str, typer.Option(help="comma-separated: " + ",".join(PREDICTORS))] = ",".join(
        PREDICTORS
    ),
    utilisation: Annotated[
        float, typer.Option(help="average share of cores allocated (demand target)")
    ] = 0.7,
    history_days: Annotated[float, typer.Option(help="days of history the model trains on")] = 21.0,
    model: Annotated[
        str, typer.Option(help="lifetime model: distribution (§3, bins + uptime conditioning) or point")
    ] = "distribution",
    class_risk: Annotated[
        float, typer.Option(help="LAVA class from a distribution: the shortest class outlived w.p. <= this")
    ] = DEFAULT_CLASS_RISK,
    label: Annotated[str, typer.Option(help="point model label: mean (E[T_r|T_u], §3) or log")] = "mean",
    uptime_input: Annotated[
        bool,
        typer.Option(help="distribution model: the uptime as an input, on uptime-expanded examples (§3)"),
    ] = False,
    defrag_below: Annotated[float, typer.Option(help="defragment when empty hosts fall below this %")] = 5.0,
    maintenance_every: Annotated[
        float, typer.Option(help="hours between maintenance rounds of the LARS run (§6.3; 0: no LARS run)")
    ] = 6.0,
    maintenance_hosts: Annotated[int, typer.Option(help="hosts drained per maintenance round")] = 2,
    maintenance_in_runs: Annotated[
        bool, typer.Option(help="also drain hosts for maintenance in the policy runs (not in §6.1)")
    ] = False,
    *,
    placement: ShardPlacement,
) -> None:
    """Replays a VM trace against a host pool under best fit, LA-Binary, LAS and LAVA."""
    config = checked_options(
        lambda: StudyConfig(
            trace=trace,
            hosts=hosts,
            days=days,
            seed=seed,
            policies=_split(policies, placement_names(), "policies"),
            predictors=_split(predictor, PREDICTORS, "predictors"),
            utilisation=utilisation,
            history_days=history_days,
            model=model,
            class_risk=class_risk,
            training=TrainingParams(label=LabelTransform(label)),
            distribution=DistributionParams(uptime_input=uptime_input),
            drain=DrainConfig(
                defrag_below_pct=defrag_below,
                maintenance_every=maintenance_every * HOUR if maintenance_in_runs else 0.0,
                maintenance_hosts=maintenance_hosts,
            ),
            lars_drain=DrainConfig(
                maintenance_every=maintenance_every * HOUR, maintenance_hosts=maintenance_hosts
            ),
        )
    )
    _check_trace_file(trace)
    table: VmTrace | None = None
    if trace.startswith("azure:"):
        try:
            table = read_azure_vm_table(trace.removeprefix("azure:"))
        except (OSError, ValueError) as err:
            raise typer.BadParameter(str(err), param_hint="--trace") from err
    with (
        placement.runner() as runner,
        replay_progress(description_width=22, counted=False) as progress,
    ):
        tasks: dict[str, Any] = {}

        def tell(what: str, fraction: float) -> None:
            if what not in tasks:
                tasks[what] = progress.add_task(what, total=1.0)
            progress.update(tasks[what], completed=fraction)

        try:
            summary = run_study(config, tell, runner=runner, table=table)
        except (UnicodeDecodeError, EOFError, gzip.BadGzipFile) as err:  # a trace that is not what it says
            raise typer.BadParameter(f"{trace}: {err}", param_hint="--trace") from None
    sections = write_report(summary, out)
    console.print(sections[1])
    console.print(sections[-3])
    console.print(f"wrote {out / 'summary.json'}, {out / 'results.md'}, {out / 'empty_hosts.png'}")


def _check_trace_file(trace: str) -> None:
    """An ``azure:PATH`` trace must be a readable CSV (or gzipped CSV) file, checked before the study."""
    if not trace.startswith("azure:"):
        return
    path = Path(trace.removeprefix("azure:"))
    try:
        if path.suffix == ".gz":
            check_readable_file(path, "gzipped CSV")
        else:
            check_text_file(path, "CSV")
    except TextFileError as err:
        raise typer.BadParameter(str(err), param_hint="--trace") from None


def register(eval_app: typer.Typer) -> None:
    register_study(eval_app, "lava", lava)
