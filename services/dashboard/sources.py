"""What the pages show, gathered from the Borgmaster, Autopilot and Monitoring APIs.

Each method answers with the dashboard's models; a service that does not answer within the
call budget becomes a :class:`ServiceNote` on the page instead of an error, except the
Borgmaster for pages that cannot exist without it (:class:`BorgmasterDown`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from google.protobuf.json_format import MessageToDict

from cellpilot.api.v1 import (
    autopilot_pb2,
    borgmaster_pb2,
    job_pb2,
    machine_pb2,
    monitoring_pb2,
    recommendation_pb2,
    resources_pb2,
    state_pb2,
    usage_pb2,
)
from cellpilot.client import CellpilotClient, CellpilotError, NotFoundError, RetryPolicy
from cellpilot.client.wording import autopilot_modes, enum_label, recommender_name, why
from cellpilot.platform.metrics import CellpilotMetrics
from cellpilot_services.dashboard import models, series
from cellpilot_services.dashboard.settings import DashboardSettings
from cellpilot_services.dashboard.stream_history import StreamHistory

RESOURCES: dict[str, Any] = {"cpu": resources_pb2.RESOURCE_CPU, "memory": resources_pb2.RESOURCE_MEMORY}
DIMENSIONS = {"cpu": "cpu_millicores", "memory": "memory_bytes"}
MAX_JOBS_IN_CELL_HISTORY = 50  # the cell's utilisation chart sums the largest jobs' histories
PARALLEL_HISTORY_CALLS = 4


class BorgmasterUnreachableError(Exception):
    """The Borgmaster did not answer: the page cannot be built."""


class JobNotFoundError(Exception):
    """The Borgmaster knows no such job."""


def _note(service: str, error: CellpilotError) -> models.ServiceNote:
    return models.ServiceNote(service=service, detail=error.details)


def _resources(r: resources_pb2.Resources) -> dict[str, int]:
    return {"cpu_millicores": r.cpu_millicores, "memory_bytes": r.memory_bytes}


def heatmap(histograms: list[usage_pb2.UsageHistogram], upper_bounds: list[float]) -> models.Heatmap:
    """Job histograms (one per window) -> tasks per bucket per window (Autopilot §5.2, Figure 9)."""
    buckets = len(upper_bounds)
    tasks = [[0.0] * len(histograms) for _ in range(buckets)]
    for column, h in enumerate(histograms):
        # Memory histograms count each task's window peak once; CPU ones count every raw
        # sample, so scale them to task-equivalents (Autopilot §3.2.1).
        scale = 1.0
        if h.resource == resources_pb2.RESOURCE_CPU and h.sample_count:
            scale = (h.task_count or 1) / h.sample_count
        for index, count in zip(h.bucket_indices, h.counts, strict=False):
            if 0 <= index < buckets:
                tasks[index][column] += count * scale
    return models.Heatmap(
        window_starts_ms=[h.window_start_ms for h in histograms],
        window_ends_ms=[h.window_end_ms for h in histograms],
        bucket_edges=[0.0, *upper_bounds],
        tasks=tasks,
    )


def _horizontal_decision(decision: autopilot_pb2.HorizontalDecision) -> models.HorizontalDecisionView:
    chosen = decision.chosen
    return models.HorizontalDecisionView(
        mode=enum_label(job_pb2.ScalingMode, decision.mode or job_pb2.SCALING_MODE_OFF, "SCALING_MODE_"),
        current_task_count=decision.current_task_count,
        recommended_task_count=chosen.task_count,
        raw_task_count=chosen.raw_task_count,
        stabiliser=enum_label(recommendation_pb2.Stabiliser, chosen.stabiliser, "STABILISER_"),
        usage_statistic=chosen.usage_statistic,
        decided_at_ms=chosen.window_end_ms,
        last_actuated_ms=decision.last_actuated_ms,
    )


class DashboardSources:
    def __init__(
        self, settings: DashboardSettings, history: StreamHistory | None, metrics: CellpilotMetrics | None
    ) -> None:
        budget = settings.call_budget_s
        self.client = CellpilotClient(
            borgmaster=settings.borgmaster_addresses,
            autopilot=settings.autopilot_addresses,
            monitoring=settings.monitoring_addresses,
            policy=RetryPolicy(budget_s=budget, call_timeout_s=max(budget, 1.0), max_backoff_s=0.5),
            **settings.security.client_options("dashboard"),
        )
        self.history = history
        self.metrics = metrics
        self.default_hours = settings.default_hours
        self._schemes: dict[tuple[str, int], list[float]] = {}

    async def close(self) -> None:
        await self.client.close()

    # ------------------------------------------------------------------ Borgmaster
    async def _borgmaster(self, method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return await getattr(self.client.borgmaster, method)(*args, **kwargs)
        except NotFoundError as error:
            raise JobNotFoundError(error.details) from error
        except CellpilotError as error:
            raise BorgmasterUnreachableError(error.details) from error

    async def jobs(self) -> models.JobList:
        jobs: list[state_pb2.JobStatus] = await self._borgmaster("list_jobs")
        summaries = [
            models.JobSummary(
                job_id=j.job_id,
                state=enum_label(state_pb2.JobState, j.state, "JOB_STATE_"),
                priority=j.spec.priority,
                task_count=j.spec.task_count,
                pending=j.task_counts.pending,
                running=j.task_counts.running,
                cpu_limit_millicores=j.spec.task.limits.cpu_millicores,
                memory_limit_bytes=j.spec.task.limits.memory_bytes,
                autopilot=autopilot_modes(j.spec.autopilot),
            )
            for j in jobs
        ]
        if self.metrics is not None:
            self.metrics.pending_tasks.set(sum(j.task_counts.pending for j in jobs))
        return models.JobList(jobs=summaries)

    async def _recommendations(
        self, job_id: str
    ) -> tuple[autopilot_pb2.JobRecommendations | None, list[models.ServiceNote]]:
        try:
            answer = await self.client.autopilot.get_recommendation(job_id, include_candidates=True)
            return answer.recommendations, []
        except NotFoundError:
            return None, [
                models.ServiceNote(service="autopilot", detail="no recommendations for this job yet")
            ]
        except CellpilotError as error:
            return None, [_note("autopilot", error)]

    async def job(self, job_id: str) -> models.JobDetail:
        status: state_pb2.JobStatus = (await self._borgmaster("get_job", job_id, include_tasks=True)).job
        recs, notes = await self._recommendations(job_id)
        views = []
        for decision in recs.vertical if recs is not None else []:
            name = "cpu" if decision.resource == resources_pb2.RESOURCE_CPU else "memory"
            chosen = decision.chosen if decision.chosen.recommendation_id else None
            views.append(
                models.VerticalView(
                    resource=name,  # type: ignore[arg-type]
                    mode=enum_label(job_pb2.ScalingMode, decision.mode or 1, "SCALING_MODE_"),
                    current_limit=decision.current_limit,
                    selected=recommender_name(decision.selected),
                    chosen_value=chosen.value if chosen else None,
                    chosen_explanation=why(chosen) if chosen else "",
                    candidates=[
                        models.Candidate(
                            recommender=recommender_name(c.recommender),
                            value=c.value,
                            raw_value=c.raw_value,
                            margin=c.margin,
                            explanation=why(c),
                            selected=c.recommender == decision.selected,
                        )
                        for c in decision.candidates
                    ],
                )
            )
        horizontal = (
            MessageToDict(recs.horizontal, preserving_proto_field_name=True)
            if recs is not None and recs.HasField("horizontal")
            else None
        )
        return models.JobDetail(
            job_id=job_id,
            status=MessageToDict(status, preserving_proto_field_name=True),
            autopilot=views,
            horizontal=horizontal,
            held=bool(recs.held) if recs is not None else False,
            notes=notes,
        )

    # ------------------------------------------------------------------ Monitoring
    async def _upper_bounds(self, scheme_id: str, version: int) -> list[float]:
        key = (scheme_id, version)
        if key not in self._schemes:
            scheme = await self.client.monitoring.bucket_scheme(scheme_id, version)
            self._schemes[key] = list(scheme.upper_bounds)
        return self._schemes[key]

    async def _job_histograms(
        self, job_id: str, resource: str, hours: float | None
    ) -> tuple[list[usage_pb2.UsageHistogram], list[models.ServiceNote]]:
        """The job's histograms of the last ``hours`` (default: the settings'), or a note why none."""
        request = monitoring_pb2.GetHistogramHistoryRequest(
            job_id=job_id, resource=RESOURCES[resource], page_size=2000
        )
        try:
            histograms = await self.client.monitoring.histogram_history(request)
        except CellpilotError as error:
            return [], [_note("monitoring", error)]
        return series.recent(histograms, self.default_hours if hours is None else hours), []

    async def usage(self, job_id: str, resource: str, hours: float | None) -> models.JobUsage:
        status: state_pb2.JobStatus = (await self._borgmaster("get_job", job_id, include_tasks=True)).job
        histograms, notes = await self._job_histograms(job_id, resource, hours)
        grid: models.Heatmap | None = None
        unmet: list[models.SeriesPoint] = []
        if histograms:
            try:
                bounds = await self._upper_bounds(
                    histograms[0].bucket_scheme_id, histograms[0].bucket_scheme_version
                )
                grid = heatmap(histograms, bounds)
                if resource == "cpu" and any(h.mean_total_unmet > 0 for h in histograms):
                    unmet = [
                        models.SeriesPoint(
                            t_ms=h.window_end_ms, value=h.mean_total_unmet / max(h.task_count, 1)
                        )
                        for h in histograms
                    ]
            except CellpilotError as error:
                notes.append(_note("monitoring", error))
        recs, rec_notes = await self._recommendations(job_id)
        notes.extend(rec_notes)
        decision = next(
            (d for d in (recs.vertical if recs else []) if d.resource == RESOURCES[resource]), None
        )
        return models.JobUsage(
            job_id=job_id,
            resource=resource,  # type: ignore[arg-type]
            unit="millicores" if resource == "cpu" else "bytes",
            heatmap=grid,
            limit=self._limit_series(status, resource, grid),
            recommenders=self._recommender_lines(job_id, resource, decision),
            selected_recommender=recommender_name(decision.selected) if decision else "",
            mode=enum_label(job_pb2.ScalingMode, decision.mode or 1, "SCALING_MODE_") if decision else "off",
            ooms=self._ooms(job_id, status) if resource == "memory" else [],
            notes=notes,
            unmet=unmet,
        )

    def _limit_series(
        self, status: state_pb2.JobStatus, resource: str, grid: models.Heatmap | None
    ) -> list[models.SeriesPoint]:
        streams = self.history.job(status.job_id) if self.history else None
        limits = status.spec.task.limits
        return series.steps(
            (
                models.SeriesPoint(t_ms=step.t_ms, value=getattr(step, DIMENSIONS[resource]))
                for step in (streams.limits if streams else [])
            ),
            getattr(limits, DIMENSIONS[resource]),
            status.state_since_ms or status.submitted_ms,
            (grid.window_starts_ms[0], grid.window_ends_ms[-1]) if grid and grid.window_starts_ms else None,
        )

    def _recommender_lines(
        self, job_id: str, resource: str, decision: autopilot_pb2.VerticalDecision | None
    ) -> list[models.RecommenderLine]:
        streams = self.history.job(job_id) if self.history else None
        lines = {
            name: [models.SeriesPoint(t_ms=t, value=v) for t, v in series]
            for (res, name), series in (streams.recommendations.items() if streams else [])
            if res == resource
        }
        for candidate in decision.candidates if decision else []:
            name = recommender_name(candidate.recommender)
            if name not in lines:  # no stream history: Autopilot's latest value, as one point
                lines[name] = [models.SeriesPoint(t_ms=candidate.window_end_ms, value=candidate.value)]
        return [models.RecommenderLine(recommender=n, points=p) for n, p in sorted(lines.items())]

    def _ooms(self, job_id: str, status: state_pb2.JobStatus) -> list[models.OomMarker]:
        streams = self.history.job(job_id) if self.history else None
        if streams and streams.ooms:
            return [
                models.OomMarker(t_ms=o.t_ms, task_index=o.task_index, memory_bytes=o.memory_bytes)
                for o in streams.ooms
            ]
        # Without the event stream: each task's latest OOM, if that is why it is in its state.
        return [
            models.OomMarker(
                t_ms=t.state_since_ms, task_index=t.task_index, memory_bytes=t.usage.memory_bytes
            )
            for t in status.tasks
            if t.reason == state_pb2.TASK_EVENT_KIND_OOM
        ]

    # ------------------------------------------------------------------ horizontal (Autopilot §3.3)
    async def horizontal(self, job_id: str, hours: float | None) -> models.HorizontalHistory:
        status: state_pb2.JobStatus = (await self._borgmaster("get_job", job_id)).job
        windows, notes = await self._job_histograms(job_id, "cpu", hours)
        recs, rec_notes = await self._recommendations(job_id)
        notes.extend(rec_notes)
        span = (windows[0].window_start_ms, windows[-1].window_end_ms) if windows else None
        after = span[0] if span else 0
        streams = self.history.job(job_id) if self.history else None
        specs = list(streams.limits) if streams else []
        config = status.spec.autopilot.horizontal
        task_counts = series.steps(
            (models.SeriesPoint(t_ms=s.t_ms, value=s.task_count) for s in specs if s.task_count),
            status.spec.task_count,
            status.state_since_ms or status.submitted_ms,
            span,
        )
        limits = [(s.t_ms, s.cpu_millicores) for s in specs] or [(0, status.spec.task.limits.cpu_millicores)]
        if config.reference_cpu_millicores > 0:  # r* is a share of the fixed reference size
            limits = [(0, config.reference_cpu_millicores)]
        raw_lines: list[models.RecommenderLine] = []
        statistic: list[models.SeriesPoint] = []
        for name, points in sorted((streams.horizontal if streams else {}).items()):
            recent = [p for p in points if p.t_ms >= after]
            statistic = statistic or [
                models.SeriesPoint(t_ms=p.t_ms, value=p.usage_statistic)
                for p in recent
                if p.usage_statistic > 0
            ]
            raw = series.raw_task_counts(recent, config.target_utilization, limits)
            if raw:
                raw_lines.append(models.RecommenderLine(recommender=name, points=raw))
        decision = recs.horizontal if recs is not None and recs.HasField("horizontal") else None
        return models.HorizontalHistory(
            job_id=job_id,
            mode=enum_label(job_pb2.ScalingMode, config.mode or job_pb2.SCALING_MODE_OFF, "SCALING_MODE_"),
            target_utilization=config.target_utilization,
            cpu_limit_millicores=config.reference_cpu_millicores or status.spec.task.limits.cpu_millicores,
            task_count=task_counts,
            raw_recommendations=raw_lines,
            demand=series.demand(windows),
            demand_statistic=statistic,
            decision=_horizontal_decision(decision) if decision and decision.HasField("chosen") else None,
            notes=notes,
        )

    # ------------------------------------------------------------------ cell and pending
    async def cell(self) -> models.CellView:
        machines: list[machine_pb2.Machine] = await self._borgmaster("list_machines")
        views = [
            models.MachineView(
                machine_id=m.spec.machine_id,
                state=enum_label(machine_pb2.MachineState, m.state, "MACHINE_STATE_"),
                rack=m.spec.rack,
                task_count=m.task_count,
                capacity=_resources(m.spec.capacity),
                usage=_resources(m.usage),
                reserved=_resources(m.reserved),
                allocated=_resources(m.allocated),
            )
            for m in machines
        ]
        totals: dict[str, dict[str, int]] = {}
        for key in ("capacity", "usage", "reserved", "allocated"):
            totals[key] = {
                dim: sum(getattr(v, key)[dim] for v in views if v.state != "down")
                for dim in ("cpu_millicores", "memory_bytes")
            }
        return models.CellView(machines=views, totals=totals)

    async def cell_utilisation(
        self, hours: float | None, cell: models.CellView | None = None
    ) -> models.CellUtilisation:
        """Used vs capacity over time: the jobs' summed usage per window (the Monitoring API's job
        histograms) against the capacity and allocation of the machines up now (the Borgmaster;
        ``cell`` if the caller has it already)."""
        cell = cell or await self.cell()
        jobs: list[state_pb2.JobStatus] = await self._borgmaster("list_jobs")
        largest = sorted(
            jobs,
            key=lambda j: -j.spec.task_count * (j.spec.task.limits.cpu_millicores + 1),
        )[:MAX_JOBS_IN_CELL_HISTORY]
        notes: list[models.ServiceNote] = []
        if len(jobs) > len(largest):
            notes.append(
                models.ServiceNote(
                    service="dashboard",
                    detail=f"the chart sums the {len(largest)} largest of {len(jobs)} jobs",
                )
            )
        gate = asyncio.Semaphore(PARALLEL_HISTORY_CALLS)

        async def history(job_id: str, resource: str) -> tuple[str, list[usage_pb2.UsageHistogram]]:
            async with gate:
                if any(n.service == "monitoring" for n in notes):
                    return job_id, []  # it did not answer for another job: do not wait again
                windows, failed = await self._job_histograms(job_id, resource, 0)
            notes.extend(n for n in failed if n not in notes)
            return job_id, windows

        span = self.default_hours if hours is None else hours
        views = {}
        for resource, dim in DIMENSIONS.items():
            answers = await asyncio.gather(*(history(j.job_id, resource) for j in largest))
            used, by_job = series.cell_usage(dict(answers), span)
            views[resource] = models.ResourceUtilisation(
                unit="millicores" if resource == "cpu" else "bytes",
                capacity=cell.totals["capacity"][dim],
                allocated=cell.totals["allocated"][dim],
                used=used,
                by_job=by_job,
            )
        return models.CellUtilisation(
            cpu=views["cpu"], memory=views["memory"], jobs_counted=len(largest), notes=cell.notes + notes
        )

    async def pending(self) -> models.PendingView:
        request = borgmaster_pb2.ListJobsRequest()
        jobs: list[state_pb2.JobStatus] = await self._borgmaster("list_jobs", request)
        waiting = [j for j in jobs if j.task_counts.pending and j.state != state_pb2.JOB_STATE_DEAD]
        if self.metrics is not None:
            self.metrics.pending_tasks.set(sum(j.task_counts.pending for j in waiting))
        views = []
        for job in waiting:
            try:
                why_pending: borgmaster_pb2.WhyPendingResponse = await self._borgmaster(
                    "why_pending", job.job_id
                )
            except JobNotFoundError:
                continue
            views.append(
                models.PendingJob(
                    job_id=job.job_id,
                    state=enum_label(state_pb2.JobState, job.state, "JOB_STATE_"),
                    pending_tasks=job.task_counts.pending,
                    task_index=why_pending.task_index,
                    summary=why_pending.summary,
                    machines_feasible=why_pending.machines_feasible,
                    machines_total=why_pending.machines_total,
                    fitting_limits=_resources(why_pending.fitting_limits)
                    if why_pending.HasField("fitting_limits")
                    else None,
                    lifetime_class=why_pending.lifetime.class_name,
                )
            )
        return models.PendingView(jobs=views)


__all__ = ["BorgmasterUnreachableError", "DashboardSources", "JobNotFoundError", "heatmap"]
