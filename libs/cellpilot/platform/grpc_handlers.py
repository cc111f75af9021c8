"""Server interceptors' common step: run a unary-request handler inside a context of their own.

A grpc.aio server interceptor (tracing, admission, store outages) wraps the servicer's
handler so each call runs inside something: a span, the caller's identity, an exception
translation. :class:`HandlerWrappingInterceptor` is that interceptor's frame: it looks up
the servicer's handler and gives it, with the method's name and the call's metadata, to the
subclass's :meth:`~HandlerWrappingInterceptor.wrap`. ``around(request, context)`` gives the
per-call context as an async context manager; these functions build the wrapped handler
with the original (de)serialisers, awaiting the servicer whether it is a coroutine or a
plain function and streaming whether it yields asynchronously or returns an iterable.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import grpc

CallContext = Callable[[Any, grpc.aio.ServicerContext], AbstractAsyncContextManager[Any]]
Metadata = Sequence[tuple[str, str | bytes]]


class HandlerWrappingInterceptor(grpc.aio.ServerInterceptor):
    """A server interceptor that replaces each method's handler by :meth:`wrap`'s.

    Methods without a handler (unknown to the server) pass through untouched.
    """

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method: str = handler_call_details.method  # type: ignore[attr-defined]
        metadata = tuple(handler_call_details.invocation_metadata or ())  # type: ignore[attr-defined]
        return self.wrap(handler, method, metadata)

    def wrap(self, handler: grpc.RpcMethodHandler, method: str, metadata: Metadata) -> grpc.RpcMethodHandler:
        """The handler that serves ``method`` (``handler`` itself to leave the call alone)."""
        raise NotImplementedError


def unary_unary_within(handler: grpc.RpcMethodHandler, around: CallContext) -> grpc.RpcMethodHandler:
    """The unary-unary ``handler`` with every call run inside ``around(request, context)``."""
    inner = handler.unary_unary

    async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with around(request, context):
            result = inner(request, context)
            return await result if inspect.isawaitable(result) else result

    return grpc.unary_unary_rpc_method_handler(
        unary_unary,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


def unary_stream_within(handler: grpc.RpcMethodHandler, around: CallContext) -> grpc.RpcMethodHandler:
    """The unary-stream ``handler`` with every call (all of its stream) run inside ``around``."""
    inner = handler.unary_stream

    async def unary_stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async with around(request, context):
            result = inner(request, context)
            if inspect.isasyncgen(result):
                async for item in result:
                    yield item
            else:
                for item in await result if inspect.isawaitable(result) else result:
                    yield item

    return grpc.unary_stream_rpc_method_handler(
        unary_stream,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


def unary_calls_within(handler: grpc.RpcMethodHandler, around: CallContext) -> grpc.RpcMethodHandler | None:
    """``handler`` wrapped by ``around`` if its request is unary; None for a streaming request."""
    if handler.unary_unary is not None:
        return unary_unary_within(handler, around)
    if handler.unary_stream is not None:
        return unary_stream_within(handler, around)
    return None
