"""The dashboard's pages: server-rendered HTML with inline SVG charts (the frame, tables and
formatting are in :mod:`page_layout`; sign-in pages in :mod:`sign_in_pages`).

Every section that changes while a page is open is a ``live`` section, which the page's
script refreshes in place (``refresh_s``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from cellpilot_services.dashboard import models
from cellpilot_services.dashboard.page_layout import (
    Viewer,
    amount,
    cores,
    escape,
    gib,
    job_link,
    layout,
    live,
    notes,
    table,
)

NO_SCALING = {"", "SCALING_MODE_UNSPECIFIED", "SCALING_MODE_OFF"}


def _event_time(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%m-%d %H:%M:%S") if ms else "never"


def overview(jobs: models.JobList, viewer: Viewer, refresh_s: float) -> str:
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
    body = live("notes", notes(jobs.notes)) + live("section-jobs", table(headers, rows, "jobs"))
    return layout("Jobs", body, viewer, refresh_s)


def scales_horizontally(detail: models.JobDetail) -> bool:
    """The job has horizontal Autopilot configured, or Autopilot has a horizontal decision for it."""
    mode = detail.status.get("spec", {}).get("autopilot", {}).get("horizontal", {}).get("mode", "")
    return detail.horizontal is not None or mode not in NO_SCALING


def _job_header(detail: models.JobDetail) -> str:
    spec: dict[str, Any] = detail.status.get("spec", {})
    limits = spec.get("task", {}).get("limits", {})
    return (
        f"<p>state <b>{escape(str(detail.status.get('state', '')).removeprefix('JOB_STATE_').lower())}</b>, "
        f"{escape(str(spec.get('task_count', 0)))} tasks, limits "
        f"{cores(float(limits.get('cpu_millicores', 0)))} cores / "
        f"{gib(float(limits.get('memory_bytes', 0)))}, "
        f"spec version {escape(str(detail.status.get('spec_version', '')))}"
        + (" — <b>held for Autopilot's first recommendation</b>" if detail.held else "")
        + "</p>"
    )


def _vertical(view: models.VerticalView) -> str:
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
    return (
        f"<h3>Autopilot {escape(view.resource)}: mode {escape(view.mode)}, limit now "
        f"{amount(view.resource, view.current_limit)}, chosen {escape(view.selected)} → "
        f"{amount(view.resource, view.chosen_value)}</h3><p>{escape(view.chosen_explanation)}</p>"
        + table(["recommender", "value", "raw", "margin", "why", ""], rows, f"candidates-{view.resource}")
    )


def _facts(pairs: Iterable[tuple[str, str]], facts_id: str) -> str:
    items = "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in pairs)
    return f'<dl class="facts" id="{escape(facts_id)}">{items}</dl>'


def _horizontal(history: models.HorizontalHistory, chart: str) -> str:
    """The horizontal section (Autopilot §3.3): the decision in words, then the chart."""
    pairs = [("mode", history.mode), ("target utilisation r*", f"{history.target_utilization:g}")]
    decision = history.decision
    if decision is not None:
        pairs += [
            ("tasks now", str(decision.current_task_count)),
            (
                "recommended",
                f"{decision.recommended_task_count} tasks (raw n_r {decision.raw_task_count:.2f}; "
                f"decided by {decision.stabiliser}, at {_event_time(decision.decided_at_ms)})",
            ),
            ("r_S (CPU statistic)", f"{cores(decision.usage_statistic)} cores"),
            ("last actuated", _event_time(decision.last_actuated_ms)),
        ]
    else:
        pairs.append(("recommended", "no decision from Autopilot yet"))
    return "<h2>tasks (horizontal)</h2>" + live(
        "horizontal",
        _facts(pairs, "horizontal-decision") + f'<div class="chart" id="chart-horizontal">{chart}</div>',
    )


def job_page(
    detail: models.JobDetail,
    charts: dict[str, str],
    usage: dict[str, models.JobUsage],
    horizontal: tuple[models.HorizontalHistory, str] | None,
    viewer: Viewer,
    refresh_s: float,
) -> str:
    seen = {(n.service, n.detail) for n in detail.notes}
    more = [n for u in usage.values() for n in u.notes] + (horizontal[0].notes if horizontal else [])
    extra = list({(n.service, n.detail): n for n in more if (n.service, n.detail) not in seen}.values())
    body = [live("summary", _job_header(detail)), live("notes", notes(detail.notes + extra))]
    for resource in ("memory", "cpu"):
        if resource in charts:
            body.append(f"<h2>{resource}</h2>" + live(f"chart-{resource}", charts[resource], css="chart"))
    body.append(live("autopilot", "".join(_vertical(view) for view in detail.autopilot)))
    if horizontal is not None:
        body.append(_horizontal(*horizontal))
    task_rows = [
        [
            str(t.get("task_index", 0)),
            escape(str(t.get("state", "")).removeprefix("TASK_STATE_").lower()),
            escape(str(t.get("reason", "")).removeprefix("TASK_EVENT_KIND_").lower()),
            escape(str(t.get("machine_id", "-"))),
            cores(float(t.get("usage", {}).get("cpu_millicores", 0))),
            gib(float(t.get("usage", {}).get("memory_bytes", 0))),
            str(t.get("restarts", 0)),
            restart_cell(t),
            escape(str(t.get("last_failure", "") or t.get("reason_detail", ""))),
        ]
        for t in detail.status.get("tasks", [])
    ]
    headers = [
        "task",
        "state",
        "reason",
        "machine",
        "cpu used",
        "memory used",
        "restarts",
        "next restart",
        "last failure",
    ]
    body.append("<h2>tasks</h2>" + live("section-tasks", table(headers, task_rows, "tasks")))
    return layout(f"Job {detail.job_id}", "".join(body), viewer, refresh_s)


def restart_cell(task: dict[str, Any]) -> str:
    """A task's restart backoff (Borg §4): failures in a row and when it may run again."""
    failures = int(str(task.get("failures", 0) or 0))
    next_ms = int(str(task.get("next_restart_ms", 0) or 0))
    if not failures:
        return "-"
    state = str(task.get("state", ""))
    when = time.strftime("%H:%M:%S", time.gmtime(next_ms / 1000)) if next_ms else "-"
    avoided = task.get("avoided_machines") or []
    avoid = f", avoiding {len(avoided)} machine(s)" if isinstance(avoided, list) and avoided else ""
    if state == "TASK_STATE_PENDING" and next_ms:
        return escape(f"at {when} UTC after {failures} failure(s){avoid}")
    return escape(f"{failures} failure(s) in a row{avoid}")


def cell_page(
    cell: models.CellView,
    chart: str,
    utilisation: models.CellUtilisation,
    utilisation_chart: str,
    viewer: Viewer,
    refresh_s: float,
) -> str:
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
    seen = {(n.service, n.detail) for n in cell.notes}
    extra = [n for n in utilisation.notes if (n.service, n.detail) not in seen]
    body = (
        live("notes", notes(cell.notes + extra))
        + live("section-totals", summary)
        + "<h2>utilisation over time</h2>"
        + live("chart-utilisation", utilisation_chart, css="chart")
        + "<h2>machines now</h2>"
        + live("chart-cell", chart, css="chart")
        + live("section-machines", machines)
    )
    return layout("Cell", body, viewer, refresh_s)


def pending_page(pending: models.PendingView, viewer: Viewer, refresh_s: float) -> str:
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
            escape(p.lifetime_class or "-"),
        ]
        for p in pending.jobs
    ]
    headers = [
        "job",
        "state",
        "pending tasks",
        "feasible machines",
        "why pending",
        "would fit with",
        "lifetime class",
    ]
    listing = table(headers, rows, "pending") if rows else '<p id="no-pending">no pending tasks</p>'
    body = live("notes", notes(pending.notes)) + live("section-pending", listing)
    return layout("Pending jobs", body, viewer, refresh_s)


def reports_page(reports: models.ReportList, viewer: Viewer) -> str:
    rows = [
        [f'<a href="/reports/{escape(r.name)}">{escape(r.name)}</a>', escape(r.kind), escape(r.source)]
        for r in reports.reports
    ]
    body = (
        table(["report", "kind", "source"], rows, "reports") if rows else "<p>no evaluation reports found</p>"
    )
    return layout("Evaluation reports", body, viewer)


def report_page(report: models.Report, rendered: str, viewer: Viewer) -> str:
    if report.kind == "markdown":
        return layout(report.name, f'<article id="report">{rendered}</article>', viewer)
    return layout(
        report.name, f'<pre id="report">{escape(json.dumps(report.content, indent=2))}</pre>', viewer
    )


def api_page(schema: dict[str, Any], viewer: Viewer) -> str:
    """The JSON API, listed from the OpenAPI schema (served at /openapi.json; no CDN-hosted viewer)."""
    rows = [
        [
            escape(method.upper()),
            f"<code>{escape(path)}</code>",
            escape(" ".join(operation.get("description", "").split())),
        ]
        for path, methods in schema.get("paths", {}).items()
        for method, operation in methods.items()
    ]
    intro = (
        "<p>Every page has a JSON twin. Send <code>Authorization: Bearer TOKEN</code> "
        "(<code>cellpilot certs token --user NAME</code>); the schema is "
        '<a href="/openapi.json">/openapi.json</a>.</p>'
    )
    return layout("API", intro + table(["method", "path", "what"], rows, "operations"), viewer)
