"""The frontier part of ``cellpilot eval horizontal``: the sweep's options, a task-hours against
overloaded-minutes plot per workload and the report's frontier sections (the data comes from
:mod:`cellpilot.evaluate.horizontal_frontiers`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import typer

from cellpilot.evaluate.horizontal_config import SweepGrid
from cellpilot.evaluate.horizontal_frontiers import HPA
from cellpilot.evaluate.report import markdown_table, plot_scatter


def _floats(text: str, option: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise typer.BadParameter(
            f"{text!r} is not a comma-separated list of numbers", param_hint=option
        ) from None


def sweep_options(
    hpa_targets: str,
    hpa_windows: str,
    autopilot_targets: str,
    autopilot_horizons: str,
    autopilot_deferrals: str,
) -> SweepGrid:
    """The sweep's grid from its comma-separated options (SweepGrid checks the values)."""
    return SweepGrid(
        hpa_targets=_floats(hpa_targets, "--hpa-targets"),
        hpa_windows_s=_floats(hpa_windows, "--hpa-windows"),
        autopilot_targets=_floats(autopilot_targets, "--autopilot-targets"),
        autopilot_horizons_h=_floats(autopilot_horizons, "--autopilot-horizons"),
        autopilot_deferrals_h=_floats(autopilot_deferrals, "--autopilot-deferrals"),
    )


def frontier_plot_name(workload: str) -> str:
    return f"horizontal_frontier_{workload.replace(':', '_')}.png"


def _xy(rows: Sequence[dict[str, Any]]) -> tuple[list[float], list[float]]:
    return [r["task_hours"] for r in rows], [r["overloaded_minutes"] for r in rows]


def frontier_plots(out: Path, summary: dict[str, Any]) -> list[str]:
    """Per checked workload: every HPA and Autopilot setting as a point (task-hours, overloaded
    minutes), the defaults marked, the HPA's frontier as a staircase."""
    names = []
    for check in summary["frontier"]["workloads"]:
        workload = check["workload"]
        rows = [r for r in summary["rows"] if r["workload"] == workload]
        series = {}
        for decider in dict.fromkeys(
            r["decider"] for r in rows if r["decider"] == HPA or "autopilot" in r["decider"]
        ):
            mine = [r for r in rows if r["decider"] == decider]
            series[f"{decider} ({len(mine)} settings)"] = _xy(mine)
        for decider in (HPA, "autopilot-cpu"):
            default = [r for r in rows if r["decider"] == decider and r.get("default")]
            if default:
                series[f"{decider} at its defaults"] = _xy(default)
        bound = [r for r in rows if r["decider"] == "bound"]
        if bound:
            series["bound (clairvoyant)"] = _xy(bound)
        frontier = [c["hpa"] for c in check["hpa_frontier"]]
        xs, ys = _xy(frontier)
        if xs:  # the staircase runs on to the right at the last (least) overload
            xs, ys = [*xs, max(r["task_hours"] for r in rows)], [*ys, ys[-1]]
        name = frontier_plot_name(workload)
        plot_scatter(
            out / name,
            series,
            "task-hours (mean over seeds)",
            "overloaded minutes (symlog)",
            f"{workload}: every setting of the HPA and Autopilot",
            log_y=True,
            lines={"HPA's frontier": (xs, ys)},
            linear_below=1.0,
            colormap="tab10",
        )
        names.append(name)
    return names


def _miss(check: dict[str, Any], slack: float) -> str:
    if check["covered"]:
        return ""
    hpa = check["hpa"]
    parts = []
    near = check["least_overload_within_cost"]
    if near is not None:
        parts.append(
            f"within +{slack:.0%} task-h the least overload is {near['label']}: "
            f"{near['overloaded_minutes']:.1f} min"
        )
    cheap = check["least_task_hours_at_no_more_overload"]
    if cheap is not None:
        ratio = cheap["task_hours"] / hpa["task_hours"] if hpa["task_hours"] > 0 else float("inf")
        parts.append(f"at no more overload the fewest task-h is {cheap['label']}: {ratio:.2f}x")
    return "; ".join(parts) or "no Autopilot setting"


def frontier_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """One table row per point of each workload's HPA frontier."""
    slack = summary["frontier"]["cost_slack"]
    out = []
    for check in summary["frontier"]["workloads"]:
        for point in check["hpa_frontier"]:
            hpa, ap = point["hpa"], point["autopilot"]
            out.append(
                {
                    "workload": check["workload"],
                    "hpa": hpa["label"].removeprefix(f"{HPA} "),
                    "hpa_task_hours": hpa["task_hours"],
                    "hpa_overloaded_minutes": hpa["overloaded_minutes"],
                    "met": "met" if point["covered"] else "**missed**",
                    "autopilot": ap["label"] if ap else "–",
                    "ap_task_hours": ap["task_hours"] if ap else None,
                    "ap_overloaded_minutes": ap["overloaded_minutes"] if ap else None,
                    "ratio": ap["task_hours"] / hpa["task_hours"] if ap and hpa["task_hours"] > 0 else None,
                    "nearest": _miss(point, slack),
                }
            )
    return out


_FRONTIER_COLUMNS = (
    "workload", "hpa", "hpa_task_hours", "hpa_overloaded_minutes", "met", "autopilot",
    "ap_task_hours", "ap_overloaded_minutes", "ratio", "nearest",
)  # fmt: skip
_FRONTIER_HEADERS = {
    "hpa": "HPA frontier point",
    "hpa_task_hours": "HPA task-h",
    "hpa_overloaded_minutes": "HPA overloaded min",
    "autopilot": "Autopilot setting (least overload among those that cover it)",
    "ap_task_hours": "its task-h",
    "ap_overloaded_minutes": "its overloaded min",
    "ratio": "task-h ratio",
    "nearest": "when missed: how near Autopilot comes",
}
_FRONTIER_FORMATS = {
    "hpa_task_hours": ".0f",
    "hpa_overloaded_minutes": ".1f",
    "ap_task_hours": ".0f",
    "ap_overloaded_minutes": ".1f",
    "ratio": ".3f",
}


def frontier_summary_line(summary: dict[str, Any]) -> str:
    rows = frontier_rows(summary)
    met = sum(1 for r in rows if r["met"] == "met")
    return f"HPA frontier points covered by an Autopilot setting: {met} of {len(rows)}"


def frontier_sections(summary: dict[str, Any], plots: Sequence[str]) -> list[str]:
    """The report's sections on the sweep: the goal table, the settings to pick, the plots."""
    report = summary.get("frontier") or {}
    if not report.get("workloads"):
        return []
    slack = report["cost_slack"]
    sections = [
        "## Autopilot against the HPA's frontier (the goal)\n",
        f"Goal: for every point of the HPA's task-hours/overloaded-minutes frontier (the HPA "
        f"settings no other HPA setting beats on both), some Autopilot setting within "
        f"{slack:.0%} of its task-hours (at most {1 + slack:g}x) at no more overloaded minutes. "
        "Points are means over seeds; every Autopilot setting swept (and the target-size source at "
        "its defaults) is a candidate.\n",
        f"**{frontier_summary_line(summary)}.**\n",
        markdown_table(frontier_rows(summary), _FRONTIER_COLUMNS, _FRONTIER_FORMATS, _FRONTIER_HEADERS),
        "### Which Autopilot settings to pick\n",
        "The Autopilot settings that cover the most HPA frontier points over all workloads (ties: "
        "fewer overloaded minutes, then fewer task-hours, summed over the workloads):\n",
        markdown_table(
            [{**r, "covers": f"{r['covers']} of {r['of']}"} for r in report["recommended"]],
            ("label", "covers", "task_hours", "overloaded_minutes"),
            {"task_hours": ".0f", "overloaded_minutes": ".1f"},
            {
                "label": "setting",
                "covers": "HPA frontier points covered",
                "task_hours": "task-h (sum over workloads)",
                "overloaded_minutes": "overloaded min (sum)",
            },
        ),
        "### Autopilot's own frontier per workload\n",
        markdown_table(
            [
                {"workload": check["workload"], **point}
                for check in report["workloads"]
                for point in check["autopilot_frontier"]
            ],
            ("workload", "label", "task_hours", "overloaded_minutes"),
            {"task_hours": ".0f", "overloaded_minutes": ".1f"},
            {"label": "setting", "task_hours": "task-h", "overloaded_minutes": "overloaded min"},
        ),
    ]
    for check in report["workloads"]:
        name = frontier_plot_name(check["workload"])
        if name in plots:
            sections.append(f"![{check['workload']}: task-hours against overloaded minutes]({name})\n")
    return sections
