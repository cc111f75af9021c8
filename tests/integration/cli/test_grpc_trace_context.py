"""Trace context crosses a gRPC hop: the server's span is a child of the caller's span.

The platform's interceptors (GrpcServer's server side, the client's channels) carry W3C
``traceparent`` in the call metadata, as the Kafka helpers carry it in record headers.
"""

from __future__ import annotations

from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from cellpilot.platform.grpc_server import GrpcServer
from cellpilot.platform.grpc_tracing import traced_insecure_channel


async def test_server_span_continues_the_callers_trace() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    server = GrpcServer([], "127.0.0.1:0")
    port = await server.start()
    # The interceptor uses the global tracer provider, as services do after setup_telemetry.
    previous = trace._TRACER_PROVIDER
    trace._TRACER_PROVIDER = provider
    try:
        async with traced_insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            with tracer.start_as_current_span("actuate") as caller:
                answer = await stub.Check(health_pb2.HealthCheckRequest(service=""))
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
            # Without a caller's trace, health checks make no spans at all.
            await stub.Check(health_pb2.HealthCheckRequest(service=""))
    finally:
        trace._TRACER_PROVIDER = previous
        await server.stop(0)
    served = [s for s in exporter.get_finished_spans() if s.kind == trace.SpanKind.SERVER]
    assert len(served) == 1
    span = served[0]
    assert span.name == "grpc.health.v1.Health/Check"
    assert span.parent is not None
    assert span.parent.span_id == caller.get_span_context().span_id
    assert span.context.trace_id == caller.get_span_context().trace_id
    assert span.attributes is not None
    assert span.attributes["rpc.method"] == "Check"
