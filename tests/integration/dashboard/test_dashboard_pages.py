"""The dashboard against a real cell, checked in a real headless Chromium.

A Borgmaster and a Borglet fleet (event time 120x) run a three-task job; the aggregator
turns the fleet's usage samples into 1-minute histograms served by the Monitoring API;
Autopilot is deliberately not running. The job page must show a usage heatmap with the
limit line (screenshot in test-artifacts/), the cell and pending pages must render, every
page has its JSON endpoint in the OpenAPI schema, bad input is answered 422, requests
without a bearer token 401, and /metrics serves the named metrics. The dashboard serves
HTTPS with the stack's certificate and calls the services over mTLS.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))

from cell_processes import Process, grant_quota, running_cell, wait_for_machines
from headless_chromium import Chromium, chromium_binary
from stack_security import bearer_header, client_options, https_context

from cellpilot.api.v1 import job_pb2, resources_pb2
from cellpilot.client import SyncCellpilotClient
from cellpilot.platform.kafka import ensure_topics
from cellpilot.platform.topics import Topic
from cellpilot.stack import StackEndpoints
from cellpilot.stack.config import free_port

pytestmark = pytest.mark.timeout(180)
GIB = 1 << 30
USER = f"dash{uuid.uuid4().hex[:6]}"
JOB = f"{USER}/web"


def get(url: str, user: str | None = "alice") -> tuple[int, Any]:
    """GET over HTTPS (the stack's CA) as ``user`` (a bearer token; None sends none)."""
    headers = bearer_header(user, admin=False) if user else {}
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30, context=https_context()) as response:
            body = response.read()
            kind = response.headers.get("content-type", "")
            return response.status, json.loads(body) if "json" in kind else body.decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def wait_until(check: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@pytest.fixture(scope="module")
def dashboard(
    endpoints: StackEndpoints, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[str]:
    database_url = request.getfixturevalue("module_database_url")
    log_dir = tmp_path_factory.mktemp("dashboard-logs")
    suffix = uuid.uuid4().hex[:8]
    events, recommendations, histograms = (
        f"{t}.{suffix}" for t in ("borg.events", "recommendations", "usage.histograms")
    )
    asyncio.run(
        ensure_topics(
            endpoints.kafka_bootstrap,
            [Topic(events, 3, "t", "t"), Topic(recommendations, 3, "t", "t"), Topic(histograms, 6, "t", "t")],
        )
    )
    results = tmp_path_factory.mktemp("results")
    (results / "autopilot.md").write_text(
        "# Autopilot study\n\n| policy | slack |\n|---|---|\n| ml | 0.21 |\n"
    )
    out_dir = tmp_path_factory.mktemp("eval-out")
    (out_dir / "summary.json").write_text(json.dumps({"policy": "ml", "relative_slack": 0.21}))
    aggregator_port, dashboard_port, nobody = free_port(), free_port(), free_port()
    with running_cell(
        endpoints,
        database_url,
        log_dir,
        machines=2,
        borglet_env={
            "CELLPILOT_BORGLET_PUBLISH_SAMPLES": "true",
            "CELLPILOT_BORGLET_SPEEDUP": "120",
            "CELLPILOT_BORGLET_PUBLISH_INTERVAL_S": "0.5",
        },
        borgmaster_env={
            "CELLPILOT_BORGMASTER_PUBLISH_EVENTS": "true",
            "CELLPILOT_BORGMASTER_EVENTS_TOPIC": events,
        },
    ) as borgmaster:
        aggregator = Process(
            "aggregator",
            {
                "CELLPILOT_POSTGRES_URL": database_url,
                "CELLPILOT_AGGREGATOR_PORT": str(aggregator_port),
                "CELLPILOT_AGGREGATOR_HISTOGRAMS_TOPIC": histograms,
                "CELLPILOT_AGGREGATOR_CONSUMER_GROUP": f"agg-{suffix}",
                "CELLPILOT_AGGREGATOR_WINDOW_MS": "60000",
                "CELLPILOT_AGGREGATOR_GRACE_MS": "5000",
                "CELLPILOT_AGGREGATOR_OUT_OF_ORDERNESS_MS": "0",
                "CELLPILOT_AGGREGATOR_IDLE_AFTER_S": "3",
                "CELLPILOT_AGGREGATOR_METRICS_PORT": "0",
            },
            log_dir,
            endpoints,
        )
        web = Process(
            "dashboard",
            {
                "CELLPILOT_DASHBOARD_PORT": str(dashboard_port),
                "CELLPILOT_DASHBOARD_BORGMASTER_ADDRESSES": borgmaster,
                "CELLPILOT_DASHBOARD_MONITORING_ADDRESSES": f"127.0.0.1:{aggregator_port}",
                "CELLPILOT_DASHBOARD_AUTOPILOT_ADDRESSES": f"127.0.0.1:{nobody}",
                "CELLPILOT_DASHBOARD_CALL_BUDGET_S": "1",
                "CELLPILOT_DASHBOARD_DEFAULT_HOURS": "0",
                "CELLPILOT_DASHBOARD_EVENTS_TOPIC": events,
                "CELLPILOT_DASHBOARD_RECOMMENDATIONS_TOPIC": recommendations,
                "CELLPILOT_DASHBOARD_RESULTS_DIR": str(results),
                "CELLPILOT_DASHBOARD_EVAL_OUT_DIRS": str(out_dir),
            },
            log_dir,
            endpoints,
        )
        try:
            wait_for_machines(borgmaster, 2)
            grant_quota(borgmaster, USER)
            spec = job_pb2.JobSpec(
                name="web",
                user=USER,
                priority=9,
                app_class=job_pb2.APP_CLASS_LATENCY_SENSITIVE,
                task_count=3,
                task=job_pb2.TaskSpec(
                    limits=resources_pb2.Resources(cpu_millicores=800, memory_bytes=2 * GIB),
                    runtime=job_pb2.RuntimeSpec(simulated=job_pb2.SimulatedRuntime(usage_model="steady")),
                ),
            )
            with SyncCellpilotClient([borgmaster], **client_options(USER)) as client:
                client.borgmaster.submit_job(spec)
            base = f"https://127.0.0.1:{dashboard_port}"
            wait_until(lambda: get(f"{base}/healthz")[0] == 200, 30, f"the dashboard ({web.log_tail()})")
            yield base
        finally:
            web.stop()
            aggregator.stop()


@pytest.fixture(scope="module")
def module_database_url(endpoints: StackEndpoints) -> Iterator[str]:
    from sqlalchemy import make_url

    from cellpilot.platform.postgres import apply_migrations, drop_database, ensure_database

    url = str(make_url(endpoints.postgres_url).set(database=f"dash_{uuid.uuid4().hex[:10]}"))
    asyncio.run(ensure_database(url))
    asyncio.run(apply_migrations(url))
    yield url
    asyncio.run(drop_database(url))


def test_job_page_shows_a_heatmap_with_the_limit_line(
    dashboard: str, artifacts_dir: Path, tmp_path: Path
) -> None:
    def usage_with_windows() -> Any:
        status, body = get(f"{dashboard}/api/jobs/{JOB}/usage?resource=memory")
        assert status == 200, body
        grid = body["heatmap"]
        return body if grid and len(grid["window_starts_ms"]) >= 3 else None

    usage = wait_until(usage_with_windows, 90, "three memory windows from the Monitoring API")
    # Each window's memory histogram counts every task's peak once: three tasks.
    per_window = [
        sum(row[w] for row in usage["heatmap"]["tasks"])
        for w in range(len(usage["heatmap"]["window_starts_ms"]))
    ]
    assert max(per_window) == pytest.approx(3.0)
    assert usage["limit"]
    assert {p["value"] for p in usage["limit"]} == {2 * GIB}
    assert any(n["service"] == "autopilot" for n in usage["notes"])  # not running: noted, not fatal

    binary = chromium_binary()
    assert binary is not None, "Chromium is needed (.ci/run installs Debian's chromium)"
    browser = Chromium(
        binary,
        tmp_path / "profile",
        height=1400,
        headers=bearer_header("alice", admin=False),
        accept_certificates_of_unknown_ca=True,
    )
    try:
        browser.navigate(f"{dashboard}/jobs/{JOB}")
        found = browser.evaluate(
            """(() => {
                const box = (sel) => { const e = document.querySelector(sel);
                    if (!e) return null; const r = e.getBoundingClientRect(); return [r.width, r.height]; };
                return {
                    heatmap: box('#chart-memory #usage-heatmap'),
                    limit: box('#chart-memory #limit-line'),
                    cpuHeatmap: box('#chart-cpu #usage-heatmap'),
                    title: document.title,
                    note: document.body.innerText.includes('autopilot is not available'),
                };
            })()"""
        )
        assert found["heatmap"], found
        assert found["heatmap"][0] > 100, found  # drawn across the chart, and not flat
        assert found["heatmap"][1] > 5, found
        assert found["limit"], found
        assert found["limit"][0] > 100, found
        assert found["cpuHeatmap"], found
        assert JOB in found["title"]
        assert found["note"]
        browser.screenshot(artifacts_dir / "dashboard-job-page.png")
        assert (artifacts_dir / "dashboard-job-page.png").stat().st_size > 10_000

        browser.navigate(f"{dashboard}/cell")
        machines = browser.evaluate("document.querySelectorAll('#machines tbody tr').length")
        assert machines == 2
        assert browser.evaluate("document.querySelector('#chart-cell svg') !== null")
        browser.screenshot(artifacts_dir / "dashboard-cell-page.png")

        browser.navigate(f"{dashboard}/reports/autopilot")
        assert browser.evaluate("document.querySelector('#report table td').innerText") == "ml"
    finally:
        browser.close()


def test_json_endpoints_openapi_metrics_and_bad_input(dashboard: str) -> None:
    status, schema = get(f"{dashboard}/openapi.json")
    assert status == 200
    for path in (
        "/api/jobs",
        "/api/jobs/{user}/{name}",
        "/api/jobs/{user}/{name}/usage",
        "/api/cell",
        "/api/pending",
        "/api/reports",
        "/api/reports/{name}",
    ):
        assert path in schema["paths"], path
    status, jobs = get(f"{dashboard}/api/jobs")
    assert status == 200
    assert JOB in [j["job_id"] for j in jobs["jobs"]]
    status, cell = get(f"{dashboard}/api/cell")
    assert status == 200
    assert cell["totals"]["capacity"]["cpu_millicores"] == 2 * 4000
    assert cell["totals"]["allocated"]["cpu_millicores"] == 3 * 800
    status, pending = get(f"{dashboard}/api/pending")
    assert status == 200
    assert pending["jobs"] == []
    status, reports = get(f"{dashboard}/api/reports")
    assert {r["kind"] for r in reports["reports"]} == {"markdown", "summary"}

    for bad in (
        f"/api/jobs/{JOB}/usage?resource=disk",
        f"/api/jobs/{JOB}/usage?hours=-1",
        "/api/jobs/Bad%20User/web",
    ):
        status, body = get(dashboard + bad)
        assert status == 422, (bad, body)
    status, _ = get(f"{dashboard}/api/jobs/{USER}/missing")
    assert status == 404

    for anonymous in ("/api/jobs", f"/jobs/{JOB}", "/api/cell"):
        status, body = get(dashboard + anonymous, user=None)
        assert status == 401, (anonymous, body)
    status, metrics = get(f"{dashboard}/metrics", user=None)
    assert status == 200
    assert "cellpilot_pending_tasks" in metrics
