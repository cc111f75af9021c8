"""The dashboard's HTML: plain server-rendered pages with inline SVG charts (no scripts, no CDN)."""

from __future__ import annotations

import json
from html import escape
from typing import Any

from cellpilot_services.dashboard import models

GIB = float(1 << 30)

STYLE = """
body{font-family:system-ui,sans-serif;margin:0;color:#222}
nav{background:#263238;padding:.6em 1em}nav a{color:#eceff1;margin-right:1.2em;text-decoration:none}
main{padding:1em 1.5em}table{border-collapse:collapse;margin:.5em 0 1.2em}
th,td{border-bottom:1px solid #ddd;padding:.25em .7em;text-align:left;font-size:.92em}
th{background:#f5f5f5}.note{background:#fff3cd;padding:.5em 1em;border-left:4px solid #f0ad4e;margin:.5em 0}
.chart svg{max-width:100%;height:auto}.selected{font-weight:bold;color:#2e7d32}
pre{background:#f5f5f5;padding:1em;overflow:auto}
"""


def cores(millicores: float) -> str:
    return f"{millicores / 1000:.3g}"


def gib(value: float) -> str:
    return f"{value / GIB:.3g} GiB"


def amount(resource: str, value: float | None) -> str:
    if value is None:
        return "-"
    return f"{cores(value)} cores" if resource == "cpu" else gib(value)


def layout(title: str, body: str, refresh_s: int = 0) -> str:
    refresh = f'<meta http-equiv="refresh" content="{refresh_s}">' if refresh_s else ""
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8">{refresh}'
        f"<title>{escape(title)} · Cellpilot</title><style>{STYLE}</style></head><body>"
        '<nav><a href="/">jobs</a><a href="/cell">cell</a><a href="/pending">pending</a>'
        '<a href="/reports">reports</a><a href="/docs">API</a></nav>'
        f"<main><h1>{escape(title)}</h1>{body}</main></body></html>"
    )


def notes(items: list[models.ServiceNote]) -> str:
    return "".join(
        f'<div class="note">{escape(n.service)} is not available: {escape(n.detail)}</div>' for n in items
    )


def table(headers: list[str], rows: list[list[str]], table_id: str = "") -> str:
    """``rows`` hold HTML already escaped by the caller."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    ident = f' id="{escape(table_id)}"' if table_id else ""
    return f"<table{ident}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def job_link(job_id: str) -> str:
    return f'<a href="/jobs/{escape(job_id)}">{escape(job_id)}</a>'


def overview(jobs: models.JobList) -> str:
    rows = [
        [
            job_link(j.job_id),
            escape(j.state),
            str(j.priority),
            str(j.task_count),
            str(j.pending),
            str(j.running),
            cores(j.cpu_limit_millicores),
            gib(j.memory_limit_bytes),
            escape(j.autopilot),
        ]
        for j in jobs.jobs
    ]
    headers = ["job", "state", "priority", "tasks", "pending", "running", "cpu", "memory", "autopilot"]
    return layout("Jobs", notes(jobs.notes) + table(headers, rows, "jobs"), refresh_s=30)


def job_page(detail: models.JobDetail, charts: dict[str, str], usage: dict[str, models.JobUsage]) -> str:
    spec: dict[str, Any] = detail.status.get("spec", {})
    limits = spec.get("task", {}).get("limits", {})
    header = (
        f"<p>state <b>{escape(str(detail.status.get('state', '')).removeprefix('JOB_STATE_').lower())}</b>, "
        f"{escape(str(spec.get('task_count', 0)))} tasks, limits "
        f"{cores(float(limits.get('cpu_millicores', 0)))} cores / "
        f"{gib(float(limits.get('memory_bytes', 0)))}, "
        f"spec version {escape(str(detail.status.get('spec_version', '')))}"
        + (" — <b>held for Autopilot's first recommendation</b>" if detail.held else "")
        + "</p>"
    )
    seen_notes = {(n.service, n.detail) for n in detail.notes}
    extra = [n for u in usage.values() for n in u.notes if (n.service, n.detail) not in seen_notes]
    unique_extra = list({(n.service, n.detail): n for n in extra}.values())
    body = [header, notes(detail.notes + unique_extra)]
    for resource in ("memory", "cpu"):
        if resource in charts:
            body.append(
                f'<h2>{resource}</h2><div class="chart" id="chart-{resource}">{charts[resource]}</div>'
            )
    for view in detail.autopilot:
        rows = [
            [
                f'<span class="{"selected" if c.selected else ""}">{escape(c.recommender)}</span>',
                amount(view.resource, c.value),
                amount(view.resource, c.raw_value),
                amount(view.resource, c.margin),
                escape(c.explanation),
                "selected" if c.selected else "",
            ]
            for c in view.candidates
        ]
        body.append(
            f"<h3>Autopilot {escape(view.resource)}: mode {escape(view.mode)}, limit now "
            f"{amount(view.resource, view.current_limit)}, chosen {escape(view.selected)} → "
            f"{amount(view.resource, view.chosen_value)}</h3><p>{escape(view.chosen_explanation)}</p>"
            + table(["recommender", "value", "raw", "margin", "why", ""], rows, f"candidates-{view.resource}")
        )
    if detail.horizontal:
        body.append(f"<h3>horizontal</h3><pre>{escape(json.dumps(detail.horizontal, indent=2))}</pre>")
    task_rows = [
        [
            str(t.get("task_index", 0)),
            escape(str(t.get("state", "")).removeprefix("TASK_STATE_").lower()),
            escape(str(t.get("reason", "")).removeprefix("TASK_EVENT_KIND_").lower()),
            escape(str(t.get("machine_id", "-"))),
            cores(float(t.get("usage", {}).get("cpu_millicores", 0))),
            gib(float(t.get("usage", {}).get("memory_bytes", 0))),
            str(t.get("restarts", 0)),
        ]
        for t in detail.status.get("tasks", [])
    ]
    body.append(
        "<h2>tasks</h2>"
        + table(
            ["task", "state", "reason", "machine", "cpu used", "memory used", "restarts"], task_rows, "tasks"
        )
    )
    return layout(f"Job {detail.job_id}", "".join(body), refresh_s=60)


def cell_page(cell: models.CellView, chart: str) -> str:
    t = cell.totals
    summary = table(
        ["", "capacity", "used", "reserved", "allocated"],
        [
            [dim_label, *(amount(res, t[k][dim]) for k in ("capacity", "usage", "reserved", "allocated"))]
            for dim_label, res, dim in (
                ("cpu", "cpu", "cpu_millicores"),
                ("memory", "memory", "memory_bytes"),
            )
        ],
        "cell-totals",
    )
    rows = [
        [
            escape(m.machine_id),
            escape(m.state),
            escape(m.rack or "-"),
            str(m.task_count),
            f"{amount('cpu', m.usage['cpu_millicores'])} / {amount('cpu', m.reserved['cpu_millicores'])} / "
            f"{amount('cpu', m.allocated['cpu_millicores'])} of "
            f"{amount('cpu', m.capacity['cpu_millicores'])}",
            f"{gib(m.usage['memory_bytes'])} / {gib(m.reserved['memory_bytes'])} / "
            f"{gib(m.allocated['memory_bytes'])} of {gib(m.capacity['memory_bytes'])}",
        ]
        for m in cell.machines
    ]
    machines = table(
        ["machine", "state", "rack", "tasks", "cpu used / reserved / allocated", "memory"], rows, "machines"
    )
    body = notes(cell.notes) + summary + f'<div class="chart" id="chart-cell">{chart}</div>' + machines
    return layout("Cell", body, refresh_s=30)


def pending_page(pending: models.PendingView) -> str:
    rows = [
        [
            job_link(p.job_id),
            escape(p.state),
            str(p.pending_tasks),
            f"{p.machines_feasible} of {p.machines_total}",
            escape(p.summary),
            (
                f"{cores(p.fitting_limits['cpu_millicores'])} cores / {gib(p.fitting_limits['memory_bytes'])}"
                if p.fitting_limits
                else "-"
            ),
        ]
        for p in pending.jobs
    ]
    headers = ["job", "state", "pending tasks", "feasible machines", "why pending", "would fit with"]
    body = notes(pending.notes) + (table(headers, rows, "pending") if rows else "<p>no pending tasks</p>")
    return layout("Pending jobs", body, refresh_s=30)


def reports_page(reports: models.ReportList) -> str:
    rows = [
        [f'<a href="/reports/{escape(r.name)}">{escape(r.name)}</a>', escape(r.kind), escape(r.source)]
        for r in reports.reports
    ]
    body = (
        table(["report", "kind", "source"], rows, "reports") if rows else "<p>no evaluation reports found</p>"
    )
    return layout("Evaluation reports", body)


def report_page(report: models.Report, rendered: str) -> str:
    if report.kind == "markdown":
        return layout(report.name, f'<article id="report">{rendered}</article>')
    return layout(report.name, f'<pre id="report">{escape(json.dumps(report.content, indent=2))}</pre>')
