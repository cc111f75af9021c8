"""The dashboard's HTTP API and pages (FastAPI): every page has a JSON endpoint under ``/api``.

    /                         jobs                       /api/jobs
    /jobs/{user}/{name}       Autopilot job page (Fig 9) /api/jobs/{user}/{name}, .../usage?resource=,
                              and its horizontal section .../horizontal
    /cell                     machines, utilisation      /api/cell, /api/cell/utilisation
    /pending                  pending jobs, why          /api/pending
    /reports[/{name}]         evaluation reports         /api/reports[/{name}]
    /charts/...svg            the charts, as SVG         /api (the API, listed), /openapi.json
    /sign-in, /sign-out       browser sessions (sign_in.py)   /metrics (Prometheus), /healthz

Every page and API call needs a browser session or a bearer token (auth.py); a browser without
one is sent to /sign-in, an API client gets 401 JSON. Bad input (an unknown resource, negative
hours, a malformed job name) is answered 422. Everything a page loads comes from the dashboard
itself (a Content-Security-Policy allowing only its own origin; no CDN).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated
from urllib.parse import quote

import uvicorn
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request
from fastapi import Path as PathParam
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from cellpilot.platform.metrics import CellpilotMetrics, prometheus_text
from cellpilot.platform.telemetry import Telemetry
from cellpilot.security.http_auth import bearer_principal
from cellpilot_services.dashboard import charts, models, pages, trend_charts
from cellpilot_services.dashboard.auth import DashboardAuth, SignInRequiredError
from cellpilot_services.dashboard.page_layout import Viewer, escape, layout
from cellpilot_services.dashboard.reports import ReportLibrary
from cellpilot_services.dashboard.settings import DashboardSettings
from cellpilot_services.dashboard.sign_in import sign_in_router
from cellpilot_services.dashboard.sign_in_ledger import SignInLedger
from cellpilot_services.dashboard.sources import (
    BorgmasterUnreachableError,
    DashboardSources,
    JobNotFoundError,
)
from cellpilot_services.dashboard.stream_history import StreamHistory

log = logging.getLogger(__name__)

User = Annotated[str, PathParam(pattern=models.JOB_PART, max_length=200, description="the job's user")]
Name = Annotated[str, PathParam(pattern=models.JOB_PART, max_length=200, description="the job's name")]
ResourceQuery = Annotated[models.ResourceName, Query(description="cpu or memory")]
Hours = Annotated[
    float | None,
    Query(ge=0, le=24 * 365, description="Event-time hours to show, back from the newest window (0: all)"),
]
SVG = "image/svg+xml"
STATIC_DIR = Path(__file__).resolve().parent / "static"
# Only the dashboard's own origin; data: images are the heatmaps matplotlib embeds in its SVG.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; object-src 'none'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",  # a sign-in link's ticket never leaves in a Referer
}
API_PREFIXES = ("/api/", "/charts/")
GRACEFUL_SHUTDOWN_S = 3


def create_app(
    settings: DashboardSettings, history: StreamHistory | None = None, metrics: CellpilotMetrics | None = None
) -> FastAPI:
    state: dict[str, DashboardSources] = {}
    ledger = SignInLedger(settings.platform.redis_url_for("dashboard"))
    auth = DashboardAuth(settings.security, ledger, int(settings.session_hours * 3600))
    refresh_s = settings.refresh_s

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state["sources"] = DashboardSources(settings, history, metrics)
        try:
            yield
        finally:
            await state["sources"].close()
            await ledger.close()

    app = FastAPI(
        title="Cellpilot dashboard",
        description="Autopilot's job page (§5.2), the cell, pending jobs and evaluation reports.",
        version="1",
        lifespan=lifespan,
        docs_url=None,  # Swagger UI and ReDoc load from a CDN; /api lists the API instead
        redoc_url=None,
    )

    @app.middleware("http")
    async def security_headers(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        response = await call_next(request)
        response.headers.update(SECURITY_HEADERS)
        if not request.url.path.startswith("/static/"):
            response.headers["Cache-Control"] = "no-store"
        return response

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    library = ReportLibrary(settings.results_dir, settings.eval_out_dirs)
    # Every page and API call needs a session or a bearer token, /metrics a bearer token;
    # /healthz (probes), /openapi.json, /static and the sign-in pages are open.
    routes = APIRouter(dependencies=[Depends(auth.viewer)])
    signed_in = Depends(auth.viewer)  # a default value, not an annotation: it names a local

    def sources() -> DashboardSources:
        return state["sources"]

    def viewer_of(request: Request) -> Viewer | None:
        return getattr(request.state, "viewer", None)

    @app.exception_handler(SignInRequiredError)
    async def sign_in_required(request: Request, error: SignInRequiredError) -> Response:
        response: Response
        if request.method in ("GET", "HEAD") and "text/html" in request.headers.get("accept", ""):
            here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            response = RedirectResponse(f"/sign-in?next={quote(here, safe='/')}", status_code=303)
        else:
            response = JSONResponse({"detail": error.detail}, 401, headers={"WWW-Authenticate": "Bearer"})
        if error.clear_cookie:
            auth.cookies.clear(response, auth.cookies.session)
        return response

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> Response:
        """A person in a browser gets the reason as a page (a refused form, a missing report)."""
        if "text/html" in request.headers.get("accept", "") and not request.url.path.startswith(API_PREFIXES):
            body = f'<div class="error" id="error">{escape(str(error.detail))}</div>'
            page = layout(f"Error {error.status_code}", body, viewer_of(request))
            return HTMLResponse(page, status_code=error.status_code, headers=error.headers)
        return await http_exception_handler(request, error)

    @app.exception_handler(BorgmasterUnreachableError)
    async def borgmaster_down(request: Request, error: BorgmasterUnreachableError) -> Response:
        detail = f"the Borgmaster is not reachable: {error}"
        if request.url.path.startswith(API_PREFIXES):
            return JSONResponse({"detail": detail}, status_code=503)
        body = f'<div class="note">{escape(detail)}. Is the stack running (`cellpilot run`)?</div>'
        return HTMLResponse(layout("Cellpilot", body, viewer_of(request), refresh_s or 10), status_code=503)

    @app.exception_handler(JobNotFoundError)
    async def job_not_found(request: Request, error: JobNotFoundError) -> Response:
        if request.url.path.startswith(API_PREFIXES):
            return JSONResponse({"detail": str(error)}, status_code=404)
        body = f"<p>{escape(str(error))}</p>"
        return HTMLResponse(layout("Not found", body, viewer_of(request)), status_code=404)

    # ------------------------------------------------------------------ JSON
    @routes.get("/api/jobs", response_model=models.JobList, tags=["jobs"])
    async def api_jobs() -> models.JobList:
        """Every job with its state, limits and Autopilot modes."""
        return await sources().jobs()

    @routes.get("/api/jobs/{user}/{name}", response_model=models.JobDetail, tags=["jobs"])
    async def api_job(user: User, name: Name) -> models.JobDetail:
        """A job's status and tasks, and Autopilot's view of it: every recommender's value and the choice."""
        return await sources().job(f"{user}/{name}")

    @routes.get("/api/jobs/{user}/{name}/usage", response_model=models.JobUsage, tags=["jobs"])
    async def api_usage(
        user: User, name: Name, resource: ResourceQuery = "memory", hours: Hours = None
    ) -> models.JobUsage:
        """The job page's chart data: usage heatmap, limit, every recommender's line, OOM kills."""
        return await sources().usage(f"{user}/{name}", resource, hours)

    @routes.get("/api/jobs/{user}/{name}/horizontal", response_model=models.HorizontalHistory, tags=["jobs"])
    async def api_horizontal(user: User, name: Name, hours: Hours = None) -> models.HorizontalHistory:
        """The horizontal section: task count, recommended task counts and CPU demand over time."""
        return await sources().horizontal(f"{user}/{name}", hours)

    @routes.get("/api/cell", response_model=models.CellView, tags=["cell"])
    async def api_cell() -> models.CellView:
        """Machines with capacity, usage, reservation and allocation, and the cell's totals."""
        return await sources().cell()

    @routes.get("/api/cell/utilisation", response_model=models.CellUtilisation, tags=["cell"])
    async def api_cell_utilisation(hours: Hours = None) -> models.CellUtilisation:
        """CPU and memory used per window by the cell's jobs, against capacity and allocation."""
        return await sources().cell_utilisation(hours)

    @routes.get("/api/pending", response_model=models.PendingView, tags=["jobs"])
    async def api_pending() -> models.PendingView:
        """Jobs with pending tasks and why they are pending (Borg §2.6)."""
        return await sources().pending()

    @routes.get("/api/reports", response_model=models.ReportList, tags=["reports"])
    async def api_reports() -> models.ReportList:
        """Evaluation reports found in the results directory and the --out directories."""
        return library.entries()

    @routes.get("/api/reports/{name}", response_model=models.Report, tags=["reports"])
    async def api_report(name: Annotated[str, PathParam(max_length=300)]) -> models.Report:
        """One evaluation report: the markdown text, or the summary.json document."""
        report = library.report(name)
        if report is None:
            raise HTTPException(404, f"no report {name!r}")
        return report

    # ------------------------------------------------------------------ charts
    @routes.get("/charts/jobs/{user}/{name}/horizontal.svg", tags=["charts"], response_class=Response)
    async def chart_horizontal(user: User, name: Name, hours: Hours = None) -> Response:
        """The job page's horizontal chart (Autopilot §3.3), as SVG."""
        history_view = await sources().horizontal(f"{user}/{name}", hours)
        return Response(await asyncio.to_thread(trend_charts.horizontal_chart, history_view), media_type=SVG)

    @routes.get("/charts/jobs/{user}/{name}/{resource}.svg", tags=["charts"], response_class=Response)
    async def chart_job(
        user: User, name: Name, resource: models.ResourceName, hours: Hours = None
    ) -> Response:
        """The job page's chart of one resource (Autopilot Figure 9), as SVG."""
        usage = await sources().usage(f"{user}/{name}", resource, hours)
        return Response(await asyncio.to_thread(charts.job_chart, usage), media_type=SVG)

    @routes.get("/charts/cell.svg", tags=["charts"], response_class=Response)
    async def chart_cell() -> Response:
        """Each machine's usage, reservation and allocation as shares of its capacity, as SVG."""
        cell = await sources().cell()
        return Response(await asyncio.to_thread(charts.cell_chart, cell), media_type=SVG)

    @routes.get("/charts/cell/utilisation.svg", tags=["charts"], response_class=Response)
    async def chart_cell_utilisation(hours: Hours = None) -> Response:
        """The cell's CPU and memory used over time against capacity, as SVG."""
        utilisation = await sources().cell_utilisation(hours)
        return Response(
            await asyncio.to_thread(trend_charts.cell_utilisation_chart, utilisation), media_type=SVG
        )

    # ------------------------------------------------------------------ pages
    @routes.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page_jobs(viewer: Viewer = signed_in) -> str:
        return pages.overview(await sources().jobs(), viewer, refresh_s)

    @routes.get("/jobs/{user}/{name}", response_class=HTMLResponse, include_in_schema=False)
    async def page_job(user: User, name: Name, hours: Hours = None, viewer: Viewer = signed_in) -> str:
        job_id = f"{user}/{name}"
        detail = await sources().job(job_id)
        usage = {r: await sources().usage(job_id, r, hours) for r in ("memory", "cpu")}
        rendered = {r: await asyncio.to_thread(charts.job_chart, u) for r, u in usage.items()}
        horizontal = None
        if pages.scales_horizontally(detail):
            history_view = await sources().horizontal(job_id, hours)
            horizontal = (history_view, await asyncio.to_thread(trend_charts.horizontal_chart, history_view))
        return pages.job_page(detail, rendered, usage, horizontal, viewer, refresh_s)

    @routes.get("/cell", response_class=HTMLResponse, include_in_schema=False)
    async def page_cell(hours: Hours = None, viewer: Viewer = signed_in) -> str:
        cell = await sources().cell()
        utilisation = await sources().cell_utilisation(hours, cell)
        return pages.cell_page(
            cell,
            await asyncio.to_thread(charts.cell_chart, cell),
            utilisation,
            await asyncio.to_thread(trend_charts.cell_utilisation_chart, utilisation),
            viewer,
            refresh_s,
        )

    @routes.get("/pending", response_class=HTMLResponse, include_in_schema=False)
    async def page_pending(viewer: Viewer = signed_in) -> str:
        return pages.pending_page(await sources().pending(), viewer, refresh_s)

    @routes.get("/reports", response_class=HTMLResponse, include_in_schema=False)
    async def page_reports(viewer: Viewer = signed_in) -> str:
        return pages.reports_page(library.entries(), viewer)

    @routes.get("/reports/{name}", include_in_schema=False)
    async def page_report(
        name: Annotated[str, PathParam(max_length=300)], viewer: Viewer = signed_in
    ) -> Response:
        image = library.image(name)
        if image is not None:
            return FileResponse(image[0], media_type=image[1])
        report = library.report(name)
        if report is None:
            raise HTTPException(404, f"no report {name!r}")
        return HTMLResponse(pages.report_page(report, library.html(report), viewer))

    @routes.get("/reports/{path:path}", include_in_schema=False)
    async def report_file(path: str) -> Response:
        image = library.image(path)
        if image is None:
            raise HTTPException(404, f"no file {path!r}")
        return FileResponse(image[0], media_type=image[1])

    @routes.get("/api", response_class=HTMLResponse, include_in_schema=False)
    async def page_api(viewer: Viewer = signed_in) -> str:
        return pages.api_page(app.openapi(), viewer)

    # ------------------------------------------------------------------ operations
    @app.get("/metrics", include_in_schema=False)
    async def prometheus_metrics(request: Request) -> Response:
        """Prometheus text, for a bearer token of this stack only (the scraper's: Prometheus's
        ``authorization.credentials_file``); 401 without one. Browser sessions do not count."""
        bearer_principal(auth.authenticator, request)
        body, content_type = prometheus_text()
        return Response(body, media_type=content_type)

    @app.get("/healthz", tags=["operations"])
    async def healthz() -> dict[str, object]:
        """Liveness, and whether the event streams are being read (open: no credentials)."""
        return {
            "status": "ok",
            "streams_connected": history.connected if history else False,
            "records_read": history.records_read if history else 0,
        }

    app.include_router(sign_in_router(auth))
    app.include_router(routes)
    return app


async def serve(settings: DashboardSettings, stop: asyncio.Event, telemetry: Telemetry | None = None) -> None:
    """Serve the dashboard until ``stop``; reads the event streams alongside when configured."""
    metrics = CellpilotMetrics.on(telemetry.meter) if telemetry else None
    history = (
        StreamHistory(
            settings.stream_access(),
            settings.events_topic,
            settings.recommendations_topic,
            settings.max_points_per_series,
            metrics,
        )
        if settings.follow_streams
        else None
    )
    app = create_app(settings, history, metrics)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        # Browsers hold their connections open (live pages poll): stopping does not wait for them.
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        **settings.security.uvicorn_ssl_options("dashboard"),
    )
    server = uvicorn.Server(config)
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]  # run_service owns signals
    reader = asyncio.create_task(history.run(stop)) if history else None
    web = asyncio.create_task(server.serve())
    scheme = "http" if settings.security.plaintext else "https"
    log.info("dashboard listening", extra={"url": f"{scheme}://{settings.host}:{settings.port}/"})
    stopper = asyncio.create_task(stop.wait())
    await asyncio.wait({web, stopper}, return_when=asyncio.FIRST_COMPLETED)
    server.should_exit = True
    await web
    stopper.cancel()
    if reader is not None:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
