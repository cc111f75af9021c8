"""The dashboard against a real cell, used by a person in a real headless Chromium.

A Borgmaster and a Borglet fleet (event time 120x) run a three-task job with horizontal
Autopilot in dry-run (its hold released as the actuator would); the aggregator turns the
fleet's usage samples into 1-minute histograms served by the Monitoring API; the horizontal
recommender's r_S reaches the dashboard on the recommendations stream; Autopilot itself is
deliberately not running. In the browser a person is sent to the sign-in page, types a token
and submits it, sees every page render (titles, charts, tables; a screenshot of each in
test-artifacts/), watches a page update itself without a reload, and signs out, after which
pages send them to sign in again. A one-time link from `cellpilot dashboard login` signs a
browser in once and is refused the second time. No page breaks its Content-Security-Policy.
Every page has its JSON endpoint in the OpenAPI schema, bad input is answered 422, requests
without credentials 401, and /metrics serves the named metrics to a bearer token only (401 anonymous).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
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
from chromium_page import BrowserPage, chromium_binary, chromium_page
from dashboard_process import chromium_missing_reason
from playwright.sync_api import Page
from stack_security import bearer_header, client_options, https_context, security, user_token
from stream_writers import StreamWriter

from cellpilot.api.v1 import job_pb2, recommendation_pb2, resources_pb2
from cellpilot.client import SyncCellpilotClient
from cellpilot.platform.kafka import ensure_topics
from cellpilot.platform.topics import Topic
from cellpilot.stack import StackEndpoints
from cellpilot.stack.config import free_port

pytestmark = pytest.mark.timeout(240)
GIB = 1 << 30
USER = f"dash{uuid.uuid4().hex[:6]}"
JOB = f"{USER}/web"
TARGET_UTILISATION = 0.6
CPU_LIMIT = 800


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


def serving(url: str) -> bool:
    """True once ``url`` answers 200; False while the server is still starting (refused)."""
    try:
        return get(url)[0] == 200
    except urllib.error.URLError:
        return False


def wait_until(check: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def web_spec(name: str, tasks: int) -> job_pb2.JobSpec:
    return job_pb2.JobSpec(
        name=name,
        user=USER,
        priority=9,
        app_class=job_pb2.APP_CLASS_LATENCY_SENSITIVE,
        task_count=tasks,
        task=job_pb2.TaskSpec(
            limits=resources_pb2.Resources(cpu_millicores=CPU_LIMIT, memory_bytes=2 * GIB),
            runtime=job_pb2.RuntimeSpec(simulated=job_pb2.SimulatedRuntime(usage_model="steady")),
        ),
    )


@pytest.fixture(scope="module")
def cell(
    endpoints: StackEndpoints, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[tuple[str, str, str]]:
    """(dashboard URL, Borgmaster address, recommendations topic) of a cell with the job running."""
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
                "CELLPILOT_DASHBOARD_REFRESH_S": "2",
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
            spec = web_spec("web", 3)
            spec.autopilot.horizontal.CopyFrom(
                job_pb2.HorizontalScalingConfig(
                    mode=job_pb2.SCALING_MODE_DRY_RUN,
                    min_tasks=1,
                    max_tasks=10,
                    target_utilization=TARGET_UTILISATION,
                )
            )
            with SyncCellpilotClient([borgmaster], **client_options(USER)) as client:
                client.borgmaster.submit_job(spec)
            # Autopilot is not running: release the hold as its actuator would (Autopilot §3.1).
            actuator = {"credentials": security().channel_credentials("actuator"), "token": None}
            with SyncCellpilotClient([borgmaster], **actuator) as client:
                client.borgmaster.update_job(JOB, spec, [], release_hold=True)
            base = f"https://127.0.0.1:{dashboard_port}"
            wait_until(lambda: serving(f"{base}/healthz"), 30, f"the dashboard ({web.log_tail()})")
            yield base, borgmaster, recommendations
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


@pytest.fixture(scope="module")
def dashboard(cell: tuple[str, str, str], endpoints: StackEndpoints) -> str:
    """The dashboard once the job has three windows of history and r_S on the stream."""
    base, _, recommendations = cell

    def windows(resource: str) -> Any:
        status, body = get(f"{base}/api/jobs/{JOB}/usage?resource={resource}")
        assert status == 200, body
        grid = body["heatmap"]
        return body if grid and len(grid["window_starts_ms"]) >= 3 else None

    wait_until(lambda: windows("memory"), 90, "three memory windows from the Monitoring API")
    cpu = wait_until(lambda: windows("cpu"), 60, "three CPU windows")

    async def publish() -> None:  # what the recommender workers publish for horizontal scaling
        producer = StreamWriter(endpoints.kafka_bootstrap, client_id="dashboard-test")
        await producer.start()
        try:
            for end in cpu["heatmap"]["window_ends_ms"]:
                rec = recommendation_pb2.HorizontalRecommendation(
                    recommendation_id=f"{JOB}/tasks/builtin/{end}",
                    job_id=JOB,
                    recommender=job_pb2.RecommenderRef(kind=job_pb2.RECOMMENDER_KIND_AUTO),
                    usage_statistic=1500.0,
                    window_end_ms=end,
                )
                message = recommendation_pb2.RecommendationSet(
                    job_id=JOB, window_end_ms=end, horizontal=[rec]
                )
                await producer.send(recommendations, JOB, message)
        finally:
            await producer.stop()

    asyncio.run(publish())
    wait_until(
        lambda: get(f"{base}/api/jobs/{JOB}/horizontal")[1]["raw_recommendations"], 30, "r_S on the stream"
    )
    return base


@pytest.fixture
def browser() -> Iterator[BrowserPage]:
    binary = chromium_binary()
    assert binary is not None, chromium_missing_reason()
    with chromium_page(binary, height=1400) as opened:
        yield opened


def where(page: Page) -> tuple[str, str]:
    return tuple(page.evaluate("[location.pathname, decodeURIComponent(location.search)]"))


def box(page: Page, selector: str) -> list[float] | None:
    found: list[float] | None = page.evaluate(
        f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return null; "
        "const r = e.getBoundingClientRect(); return [r.width, r.height]; })()"
    )
    return found


def test_a_person_signs_in_sees_every_page_update_itself_and_signs_out(
    dashboard: str, cell: tuple[str, str, str], browser: BrowserPage, artifacts_dir: Path
) -> None:
    page = browser.page
    # Not signed in: the job page sends the browser to sign in, and back afterwards.
    page.goto(f"{dashboard}/jobs/{JOB}")
    assert where(page) == ("/sign-in", f"?next=/jobs/{JOB}")
    assert page.evaluate("document.title") == "Sign in · Cellpilot"
    page.screenshot(path=artifacts_dir / "dashboard-sign-in.png", full_page=True)
    page.fill("#token", user_token("alice", admin=False))
    with page.expect_navigation():
        page.click("#sign-in-submit")
    assert where(page) == (f"/jobs/{JOB}", "")
    assert page.evaluate("document.querySelector('#signed-in-as').innerText") == "alice"

    session = [c for c in page.context.cookies() if c["name"] == "__Host-cellpilot-session"]
    assert len(session) == 1, page.context.cookies()
    assert (session[0]["httpOnly"], session[0]["secure"], session[0]["sameSite"], session[0]["path"]) == (
        True,
        True,
        "Strict",
        "/",
    )
    assert "cellpilot-session" not in page.evaluate("document.cookie")  # no script can read it

    # The job page: Figure 9's heatmap and limit, and the horizontal section as a chart.
    assert JOB in page.evaluate("document.title")
    heatmap = box(page, "#chart-memory #usage-heatmap")
    assert heatmap is not None
    assert heatmap[0] > 100, heatmap  # drawn across the chart,
    assert heatmap[1] > 5, heatmap  # and not flat
    assert (box(page, "#chart-memory #limit-line") or [0])[0] > 100
    assert box(page, "#chart-cpu #usage-heatmap")
    for part in ("horizontal-task-count", "horizontal-demand", "horizontal-target"):
        assert (box(page, f"#chart-horizontal #{part}") or [0])[0] > 100, part
    # n_r spans only the windows r_S was published for: a share of a time axis that grows while the
    # test runs (event time runs 120x), so it is drawn, not necessarily across the chart.
    assert (box(page, "#chart-horizontal #horizontal-raw-auto") or [0])[0] > 10
    assert page.evaluate("document.querySelector('#horizontal-decision').innerText").startswith("mode")
    assert page.evaluate("document.body.innerText.includes('autopilot is not available')")
    page.screenshot(path=artifacts_dir / "dashboard-job-page.png", full_page=True)
    assert (artifacts_dir / "dashboard-job-page.png").stat().st_size > 10_000

    pages = [
        ("/", "Jobs", "document.querySelectorAll('#jobs tbody tr').length >= 1"),
        ("/cell", "Cell", "document.querySelectorAll('#machines tbody tr').length === 2"),
        ("/pending", "Pending jobs", "document.querySelector('#no-pending, #pending') !== null"),
        ("/reports", "Evaluation reports", "document.querySelectorAll('#reports tbody tr').length === 2"),
        ("/reports/autopilot", "autopilot", "document.querySelector('#report table td').innerText === 'ml'"),
        ("/api", "API", "document.querySelectorAll('#operations tbody tr').length >= 10"),
    ]
    for path, title, rendered in pages:
        page.goto(dashboard + path)
        assert where(page)[0] == path
        assert page.evaluate("document.title") == f"{title} · Cellpilot"
        assert page.evaluate(rendered), path
        name = (
            "dashboard-cell-page.png"
            if path == "/cell"
            else f"dashboard-{path.strip('/').replace('/', '-') or 'jobs'}.png"
        )
        if path == "/cell":
            for part in ("cell-used-cpu", "cell-used-cpu-0", "cell-capacity-cpu", "cell-used-memory"):
                assert (box(page, f"#chart-utilisation #{part}") or [0])[0] > 100, part
            assert page.evaluate("document.querySelector('#chart-cell svg') !== null")
        page.screenshot(path=artifacts_dir / name, full_page=True)

    # A page updates itself: a job submitted now appears on the open jobs page, with no reload.
    page.goto(f"{dashboard}/")
    page.evaluate("window.stayed = true")
    with SyncCellpilotClient([cell[1]], **client_options(USER)) as client:
        client.borgmaster.submit_job(web_spec("later", 1))
    page.wait_for_function(  # a function, not a string: the page's CSP forbids eval
        f"() => [...document.querySelectorAll('#jobs td a')].some(a => a.innerText === '{USER}/later')",
        timeout=30_000,
    )
    assert page.evaluate("window.stayed") is True
    assert int(page.evaluate("document.body.dataset.updates")) >= 1
    assert page.evaluate("document.querySelector('#live-status').innerText").startswith("updated")

    assert browser.errors == [], browser.errors  # no Content-Security-Policy refusal, no script error

    # Signing out: back at the sign-in page, and pages send the browser there again.
    with page.expect_navigation():
        page.click("#sign-out")
    assert where(page) == ("/sign-in", "?signed_out=true")
    assert page.evaluate("document.querySelector('#sign-in-message').innerText") == "You are signed out."
    assert not [c for c in page.context.cookies() if c["name"] == "__Host-cellpilot-session"]
    page.screenshot(path=artifacts_dir / "dashboard-signed-out.png", full_page=True)
    page.goto(f"{dashboard}/cell")
    assert where(page) == ("/sign-in", "?next=/cell")


def test_a_one_time_link_signs_a_browser_in_once(
    dashboard: str, browser: BrowserPage, artifacts_dir: Path
) -> None:
    page = browser.page
    env = {**os.environ, "CELLPILOT_STACK_ENV": "/nonexistent"}
    env.pop("CELLPILOT_TOKEN", None)
    answer = subprocess.run(
        [
            str(Path(sys.executable).with_name("cellpilot")),
            "dashboard",
            "login",
            "--user",
            "bob",
            "--url",
            dashboard,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert answer.returncode == 0, answer.stderr
    link = answer.stdout.strip().splitlines()[-1]

    page.goto(link)
    assert page.evaluate("document.querySelector('#link-submit').innerText") == "Sign in as bob"
    page.screenshot(path=artifacts_dir / "dashboard-link.png", full_page=True)
    with page.expect_navigation():
        page.click("#link-submit")
    assert where(page) == ("/", "")
    assert page.evaluate("document.querySelector('#signed-in-as').innerText") == "bob"

    page.goto(link)  # the second time: refused, and no second session
    assert "already been used" in page.evaluate("document.querySelector('#sign-in-message').innerText")
    assert page.evaluate("document.querySelector('#link-submit')") is None
    page.screenshot(path=artifacts_dir / "dashboard-link-used.png", full_page=True)


def test_json_endpoints_openapi_metrics_and_bad_input(dashboard: str) -> None:
    status, schema = get(f"{dashboard}/openapi.json")
    assert status == 200
    for path in (
        "/api/jobs",
        "/api/jobs/{user}/{name}",
        "/api/jobs/{user}/{name}/usage",
        "/api/jobs/{user}/{name}/horizontal",
        "/api/cell",
        "/api/cell/utilisation",
        "/api/pending",
        "/api/reports",
        "/api/reports/{name}",
        "/api/session",
    ):
        assert path in schema["paths"], path
    status, jobs = get(f"{dashboard}/api/jobs")
    assert status == 200
    assert JOB in [j["job_id"] for j in jobs["jobs"]]
    status, cell = get(f"{dashboard}/api/cell")
    assert status == 200
    assert cell["totals"]["capacity"]["cpu_millicores"] == 2 * 4000
    assert cell["totals"]["allocated"]["cpu_millicores"] >= 3 * CPU_LIMIT
    status, pending = get(f"{dashboard}/api/pending")
    assert status == 200
    assert pending["jobs"] == []
    status, reports = get(f"{dashboard}/api/reports")
    assert {r["kind"] for r in reports["reports"]} == {"markdown", "summary"}

    # Horizontal: the task count, n_r = ceil(r_S / (r* x limit)) = ceil(1500 / 480) = 4, and demand.
    status, horizontal = get(f"{dashboard}/api/jobs/{JOB}/horizontal")
    assert status == 200
    assert horizontal["mode"] == "dry-run"
    assert {p["value"] for p in horizontal["task_count"]} == {3}
    assert [line["recommender"] for line in horizontal["raw_recommendations"]] == ["auto"]
    assert {p["value"] for p in horizontal["raw_recommendations"][0]["points"]} == {4}
    assert horizontal["demand"]
    assert all(0 < p["value"] <= 3 * CPU_LIMIT for p in horizontal["demand"])

    # The cell over time: the job's usage summed per window, against the capacity of 2 machines.
    status, utilisation = get(f"{dashboard}/api/cell/utilisation")
    assert status == 200
    assert utilisation["cpu"]["capacity"] == 2 * 4000
    assert utilisation["memory"]["capacity"] == 2 * 8 * GIB
    assert len(utilisation["cpu"]["used"]) >= 3
    assert all(0 < p["value"] <= 3 * CPU_LIMIT for p in utilisation["cpu"]["used"])
    assert [s["name"] for s in utilisation["cpu"]["by_job"]][:1] == [JOB]

    for bad in (
        f"/api/jobs/{JOB}/usage?resource=disk",
        f"/api/jobs/{JOB}/usage?hours=-1",
        f"/api/jobs/{JOB}/horizontal?hours=-1",
        "/api/cell/utilisation?hours=abc",
        "/api/jobs/Bad%20User/web",
    ):
        status, body = get(dashboard + bad)
        assert status == 422, (bad, body)
    status, _ = get(f"{dashboard}/api/jobs/{USER}/missing")
    assert status == 404

    for anonymous in ("/api/jobs", f"/jobs/{JOB}", "/api/cell", "/api/cell/utilisation", "/charts/cell.svg"):
        status, body = get(dashboard + anonymous, user=None)
        assert status == 401, (anonymous, body)
    # /metrics is for a bearer token of this stack (the scraper's), never anonymous.
    status, body = get(f"{dashboard}/metrics", user=None)
    assert status == 401, body
    status, metrics = get(f"{dashboard}/metrics", user="metrics-scraper")
    assert status == 200
    assert "cellpilot_pending_tasks" in metrics
