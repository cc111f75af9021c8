"""Trace context across gRPC hops: W3C ``traceparent`` in the call metadata.

The client interceptor puts the caller's current span context into every call's metadata;
the server interceptor continues it: each unary (and server-streaming) call runs inside a
SERVER span whose parent is the caller's span. Together with the Kafka headers
(:mod:`cellpilot.platform.kafka`), one trace follows a usage sample to the actuation it
caused and the Borgmaster update that applied it. ``GrpcServer`` installs the server side;
:class:`cellpilot.client` channels (and :func:`traced_insecure_channel`) the client side.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import grpc
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind

from cellpilot.platform.grpc_handlers import HandlerWrappingInterceptor, Metadata, unary_calls_within

tracer = trace.get_tracer(__name__)


def _span_name(method: str) -> str:
    """``/cellpilot.api.v1.Borgmaster/SubmitJob`` -> ``cellpilot.api.v1.Borgmaster/SubmitJob``."""
    return method.lstrip("/")


def _attributes(method: str) -> dict[str, str]:
    service, _, name = _span_name(method).partition("/")
    return {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name}


class TraceContextServerInterceptor(HandlerWrappingInterceptor):
    """Runs each call in a SERVER span continuing the trace named in its metadata."""

    def wrap(self, handler: grpc.RpcMethodHandler, method: str, metadata: Metadata) -> grpc.RpcMethodHandler:
        carrier = {key: value for key, value in metadata if isinstance(value, str)}
        if "traceparent" not in carrier and method.startswith("/grpc."):
            return handler  # health checks and reflection without a caller's trace: no span
        parent = propagate.extract(carrier)
        name, attributes = _span_name(method), _attributes(method)

        @asynccontextmanager
        async def server_span(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
            with tracer.start_as_current_span(
                name, context=parent, kind=SpanKind.SERVER, attributes=attributes
            ):
                yield

        # client-streaming and bidirectional calls: passed through untraced
        return unary_calls_within(handler, server_span) or handler


def _with_trace_context(details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    if not carrier:
        return details
    metadata = [(k, v) for k, v in (details.metadata or ()) if k not in carrier]
    return details._replace(metadata=grpc.aio.Metadata(*metadata, *carrier.items()))  # type: ignore[attr-defined,no-any-return]


class TraceContextClientInterceptor(
    grpc.aio.UnaryUnaryClientInterceptor, grpc.aio.UnaryStreamClientInterceptor
):
    """Adds the current trace context to the metadata of every unary and server-streaming call."""

    async def intercept_unary_unary(
        self, continuation: Callable[..., Any], client_call_details: grpc.aio.ClientCallDetails, request: Any
    ) -> Any:
        return await continuation(_with_trace_context(client_call_details), request)

    async def intercept_unary_stream(
        self, continuation: Callable[..., Any], client_call_details: grpc.aio.ClientCallDetails, request: Any
    ) -> Any:
        return await continuation(_with_trace_context(client_call_details), request)


def client_interceptors() -> list[grpc.aio.ClientInterceptor]:
    return [TraceContextClientInterceptor()]


def traced_insecure_channel(address: str, options: Sequence[tuple[str, Any]] = ()) -> grpc.aio.Channel:
    """An insecure aio channel whose calls carry the caller's trace context."""
    return grpc.aio.insecure_channel(address, options=list(options), interceptors=client_interceptors())
