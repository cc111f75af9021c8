"""The dashboard's HTTP API and pages (FastAPI): every page has a JSON endpoint under ``/api``.

    /                         jobs                       /api/jobs
    /jobs/{user}/{name}       Autopilot job page (Fig 9) /api/jobs/{user}/{name}, .../usage?resource=
    /cell                     machines, utilisation      /api/cell
    /pending                  pending jobs, why          /api/pending
    /reports[/{name}]         evaluation reports         /api/reports[/{name}]
    /charts/...svg            the charts, as SVG         /metrics (Prometheus), /healthz, /docs

Bad input (an unknown resource, negative hours, a malformed job name) is answered 422.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

import uvicorn
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response

from cellpilot.platform.metrics import CellpilotMetrics, prometheus_text
from cellpilot.platform.telemetry import Telemetry
from cellpilot.security.http_auth import http_principal_dependency
from cellpilot_services.dashboard import charts, models, pages
from cellpilot_services.dashboard.reports import ReportLibrary
from cellpilot_services.dashboard.settings import DashboardSettings
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


def create_app(
    settings: DashboardSettings, history: StreamHistory | None = None, metrics: CellpilotMetrics | None = None
) -> FastAPI:
    state: dict[str, DashboardSources] = {}

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state["sources"] = DashboardSources(settings, history, metrics)
        try:
            yield
        finally:
            await state["sources"].close()

    app = FastAPI(
        title="Cellpilot dashboard",
        description="Autopilot's job page (§5.2), the cell, pending jobs and evaluation reports.",
        version="1",
        lifespan=lifespan,
    )
    library = ReportLibrary(settings.results_dir, settings.eval_out_dirs)
    # Every page and API call needs "Authorization: Bearer <token>" (401 otherwise); only
    # /healthz and /metrics (probes, the Prometheus scraper) and the OpenAPI docs are open.
    routes = APIRouter(dependencies=[Depends(http_principal_dependency(settings.security.authenticator()))])

    def sources() -> DashboardSources:
        return state["sources"]

    @app.exception_handler(BorgmasterUnreachableError)
    async def borgmaster_down(request: Request, error: BorgmasterUnreachableError) -> Response:
        detail = f"the Borgmaster is not reachable: {error}"
        if request.url.path.startswith(("/api/", "/charts/")):
            return JSONResponse({"detail": detail}, status_code=503)
        body = f'<div class="note">{pages.escape(detail)}. Is the stack running (`cellpilot run`)?</div>'
        return HTMLResponse(pages.layout("Cellpilot", body, refresh_s=10), status_code=503)

    @app.exception_handler(JobNotFoundError)
    async def job_not_found(request: Request, error: JobNotFoundError) -> Response:
        if request.url.path.startswith(("/api/", "/charts/")):
            return JSONResponse({"detail": str(error)}, status_code=404)
        return HTMLResponse(pages.layout("Not found", f"<p>{pages.escape(str(error))}</p>"), status_code=404)

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

    @routes.get("/api/cell", response_model=models.CellView, tags=["cell"])
    async def api_cell() -> models.CellView:
        """Machines with capacity, usage, reservation and allocation, and the cell's totals."""
        return await sources().cell()

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
        report = library.report(name)
        if report is None:
            raise HTTPException(404, f"no report {name!r}")
        return report

    # ------------------------------------------------------------------ charts
    @routes.get("/charts/jobs/{user}/{name}/{resource}.svg", tags=["charts"], response_class=Response)
    async def chart_job(
        user: User, name: Name, resource: models.ResourceName, hours: Hours = None
    ) -> Response:
        usage = await sources().usage(f"{user}/{name}", resource, hours)
        return Response(await asyncio.to_thread(charts.job_chart, usage), media_type=SVG)

    @routes.get("/charts/cell.svg", tags=["charts"], response_class=Response)
    async def chart_cell() -> Response:
        cell = await sources().cell()
        return Response(await asyncio.to_thread(charts.cell_chart, cell), media_type=SVG)

    # ------------------------------------------------------------------ pages
    @routes.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page_jobs() -> str:
        return pages.overview(await sources().jobs())

    @routes.get("/jobs/{user}/{name}", response_class=HTMLResponse, include_in_schema=False)
    async def page_job(user: User, name: Name, hours: Hours = None) -> str:
        job_id = f"{user}/{name}"
        detail = await sources().job(job_id)
        usage = {r: await sources().usage(job_id, r, hours) for r in ("memory", "cpu")}
        rendered = {r: await asyncio.to_thread(charts.job_chart, u) for r, u in usage.items()}
        return pages.job_page(detail, rendered, usage)

    @routes.get("/cell", response_class=HTMLResponse, include_in_schema=False)
    async def page_cell() -> str:
        cell = await sources().cell()
        return pages.cell_page(cell, await asyncio.to_thread(charts.cell_chart, cell))

    @routes.get("/pending", response_class=HTMLResponse, include_in_schema=False)
    async def page_pending() -> str:
        return pages.pending_page(await sources().pending())

    @routes.get("/reports", response_class=HTMLResponse, include_in_schema=False)
    async def page_reports() -> str:
        return pages.reports_page(library.entries())

    @routes.get("/reports/{name}", include_in_schema=False)
    async def page_report(name: Annotated[str, PathParam(max_length=300)]) -> Response:
        image = library.image(name)
        if image is not None:
            return FileResponse(image[0], media_type=image[1])
        report = library.report(name)
        if report is None:
            raise HTTPException(404, f"no report {name!r}")
        return HTMLResponse(pages.report_page(report, library.html(report)))

    @routes.get("/reports/{path:path}", include_in_schema=False)
    async def report_file(path: str) -> Response:
        image = library.image(path)
        if image is None:
            raise HTTPException(404, f"no file {path!r}")
        return FileResponse(image[0], media_type=image[1])

    # ------------------------------------------------------------------ operations
    @app.get("/metrics", include_in_schema=False)
    async def prometheus_metrics() -> Response:
        body, content_type = prometheus_text()
        return Response(body, media_type=content_type)

    @app.get("/healthz", tags=["operations"])
    async def healthz() -> dict[str, object]:
        return {
            "status": "ok",
            "streams_connected": history.connected if history else False,
            "records_read": history.records_read if history else 0,
        }

    app.include_router(routes)
    return app


async def serve(settings: DashboardSettings, stop: asyncio.Event, telemetry: Telemetry | None = None) -> None:
    """Serve the dashboard until ``stop``; reads the event streams alongside when configured."""
    metrics = CellpilotMetrics.on(telemetry.meter) if telemetry else None
    history = (
        StreamHistory(
            settings.platform.kafka_bootstrap,
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
