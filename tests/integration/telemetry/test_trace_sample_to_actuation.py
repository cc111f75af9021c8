"""One trace from a usage sample to the actuation it caused, and the Prometheus metrics it counts.

The whole vertical loop runs in-process (the pipeline of test_autopilot_end_to_end: Borglet fleet
-> usage.samples -> aggregator -> usage.histograms -> recommender -> recommendations ->
Autopilot master -> actuations -> actuator -> Borgmaster UpdateJob) with an in-memory span
exporter. A window folds many samples and a recommender step many windows, so those hops
are joined by span links (a consumer span links to the producer spans of the records it
folded in); from the Autopilot decision on, one actuation is one trace: the decision, the
actuator's "actuate" span and the Borgmaster's UpdateJob server span share a trace id.
"""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Iterator
from contextlib import AsyncExitStack

import pytest
from autopilot_master_harness import Scenario, api_client, borgmaster, eventually, grant, job_spec
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from test_autopilot_end_to_end import LIMIT_CPU, LIMIT_MEMORY, ON, SPEEDUP
from usage_pipeline import usage_pipeline

from cellpilot.platform.metrics import CellpilotMetrics, MetricsEndpoint, prometheus_reader
from cellpilot.stack import StackEndpoints
from cellpilot_services.actuator.actuator_service import Actuator
from cellpilot_services.autopilot.autopilot_service import AutopilotMaster

# The hops, upstream of the decision, that the links must reach (span names in the services).
UPSTREAM_HOPS = (
    "borglet publish usage samples",
    "aggregate samples",
    "publish job histograms",
    "recommend",
    "autopilot decide",
)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Every finished span of this process, in memory (the global provider, set once per process)."""
    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
        provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider), "another tracer provider is installed in this process"
    processor = SimpleSpanProcessor(exporter)
    provider.add_span_processor(processor)
    yield exporter
    processor.shutdown()  # later spans go nowhere


def _upstream(start: ReadableSpan, by_id: dict[int, ReadableSpan]) -> set[str]:
    """Names of the spans reachable from ``start`` through parents and links."""
    seen: set[int] = set()
    names: set[str] = set()
    todo = [start]
    while todo:
        span = todo.pop()
        context = span.get_span_context()
        if context is None or context.span_id in seen:
            continue
        seen.add(context.span_id)
        names.add(span.name)
        refs = [link.context.span_id for link in span.links]
        if span.parent is not None:
            refs.append(span.parent.span_id)
        todo.extend(by_id[ref] for ref in refs if ref in by_id)
    return names


def _borgmaster_update_job(span: ReadableSpan) -> bool:
    """A span the Borgmaster made while serving UpdateJob: its gRPC server span or the servicer's
    own span (either is only in the caller's trace if the context crossed the gRPC hop)."""
    return "UpdateJob" in span.name and (
        span.kind == trace.SpanKind.SERVER or span.name == "Borgmaster.UpdateJob"
    )


async def test_one_actuation_is_traced_back_to_usage_samples_and_counted_on_metrics(
    fresh_database_url: str, endpoints: StackEndpoints, spans: InMemorySpanExporter
) -> None:
    reader = prometheus_reader()
    meter_provider = MeterProvider(metric_readers=[reader])
    meter = meter_provider.get_meter("cellpilot.test")
    metrics_endpoint = MetricsEndpoint(0)
    metrics_port = metrics_endpoint.start()
    scenario = Scenario(endpoints)
    await scenario.create_topics()
    try:
        async with borgmaster(fresh_database_url, scenario) as bm, AsyncExitStack() as stack:
            client = api_client([bm.address])
            stack.push_async_callback(client.close)
            await grant(client, scenario.user)
            fat = await client.borgmaster.submit_job(
                job_spec(
                    "fat", scenario.user, cpu_mode=ON, memory_mode=ON, cpu=LIMIT_CPU, memory=LIMIT_MEMORY
                )
            )
            master = AutopilotMaster(
                scenario.autopilot_settings([bm.address], hold_grace_s=0.5, metrics_port=0),
                CellpilotMetrics.on(meter),
            )
            act = Actuator(
                scenario.actuator_settings([bm.address], metrics_port=0), CellpilotMetrics.on(meter)
            )
            await stack.enter_async_context(
                usage_pipeline(scenario, fresh_database_url, [bm.address], speedup=SPEEDUP)
            )
            for service in (master, act):
                await service.start()
                stack.push_async_callback(service.stop)

            def right_sizing() -> list[ReadableSpan]:
                return [
                    s
                    for s in spans.get_finished_spans()
                    if s.name == "actuate"
                    and s.attributes is not None
                    and s.attributes.get("cellpilot.job_id") == fat.job_id
                    and s.attributes.get("cellpilot.outcome") == "ACTUATION_OUTCOME_APPLIED"
                    and s.parent is not None  # published by a decision (not the hold release)
                ]

            async def lowered() -> bool:
                limits = (await client.borgmaster.get_job(fat.job_id)).job.spec.task.limits
                return limits.cpu_millicores < LIMIT_CPU and limits.memory_bytes < LIMIT_MEMORY

            await eventually(lowered, 45, "the over-provisioned job's limits lowered")

            async def served_actuation() -> ReadableSpan | None:
                # An applied actuation whose Borgmaster server span has ended too (it ends after
                # the reply is sent, so it may lag the actuator's span on a loaded machine).
                finished = spans.get_finished_spans()
                served = {s.context.trace_id for s in finished if _borgmaster_update_job(s)}
                done = [s for s in right_sizing() if s.context.trace_id in served]
                return max(done, key=lambda s: s.end_time or 0) if done else None

            actuated = await eventually(served_actuation, 20, "an applied actuation served by the Borgmaster")

        finished = spans.get_finished_spans()
        trace_id = actuated.context.trace_id
        same_trace = [s for s in finished if s.context.trace_id == trace_id]
        names = {s.name for s in same_trace}
        # Decision -> actuations record -> actuator -> Borgmaster UpdateJob: one trace.
        assert "autopilot decide" in names, names
        assert any(n.endswith(f"{scenario.actuations} publish") for n in names), names
        update_job = [s for s in same_trace if _borgmaster_update_job(s)]
        assert update_job, f"no Borgmaster UpdateJob server span in the actuation's trace: {names}"
        decide = next(s for s in same_trace if s.name == "autopilot decide")
        # Upstream: the decision links to recommendation records, back to the samples' publisher.
        by_id = {s.context.span_id: s for s in finished}
        reached = _upstream(decide, by_id)
        missing = [hop for hop in UPSTREAM_HOPS if hop not in reached]
        assert not missing, f"not linked from the decision: {missing} (reached {sorted(reached)})"
        sample_traces = {s.context.trace_id for s in finished if s.name == "borglet publish usage samples"}
        assert trace_id not in sample_traces  # joined by links, not by one giant trace

        # The same activity on the Prometheus scrape endpoint the services serve.
        body = await asyncio.to_thread(_scrape, metrics_port)
        assert _value(body, "cellpilot_actuations_total") >= 1
        assert _value(body, "cellpilot_recommendations_total") >= 1
    finally:
        metrics_endpoint.stop()
        meter_provider.shutdown()


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


def _value(body: str, name: str) -> float:
    """The sum of a metric's samples in Prometheus text (any labels); 0 if absent."""
    total = 0.0
    for line in body.splitlines():
        if line.startswith(name) and (line[len(name)] in " {"):
            total += float(line.rsplit(" ", 1)[1])
    return total
