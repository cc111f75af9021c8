"""The grpc.aio server interceptor that admits a call before any servicer logic runs.

For each call, in order:

1. authenticate (bearer token and/or verified client certificate) -> UNAUTHENTICATED;
2. validate the request's shape against :class:`RequestLimits` -> INVALID_ARGUMENT naming the field;
3. authorise it with :func:`cellpilot.security.policy.authorize` -> PERMISSION_DENIED with the reason;
4. run the servicer with the caller in :data:`cellpilot.security.identity.current_principal`.

Health checks and reflection pass untouched (in mTLS mode the TLS handshake has already
required a certificate). Streaming-request methods have no rules and are refused.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, NoReturn

import grpc
from google.protobuf.message import Message

from cellpilot.platform.grpc_handlers import HandlerWrappingInterceptor, Metadata, unary_calls_within
from cellpilot.security.authentication import AuthenticationError, Authenticator
from cellpilot.security.identity import Principal, current_principal
from cellpilot.security.policy import JobOwnerLookup, RecommenderOwnerLookup, authorize
from cellpilot.security.request_limits import (
    DEFAULT_LIMITS,
    InvalidRequestError,
    RequestLimits,
    validate_request,
)

log = logging.getLogger(__name__)

PUBLIC_PREFIXES = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)


async def _refuse(context: grpc.aio.ServicerContext, code: grpc.StatusCode, reason: str) -> NoReturn:
    await context.abort(code, reason)
    raise AssertionError("context.abort returned")  # pragma: no cover - abort always raises


class SecurityInterceptor(HandlerWrappingInterceptor):
    """Authenticates, validates and authorises every non-public call (see module doc).

    ``refusals`` counts refused calls by (method, status code name), for metrics and tests.
    """

    def __init__(
        self,
        authenticator: Authenticator,
        *,
        job_owner_lookup: JobOwnerLookup | None = None,
        recommender_owner_lookup: RecommenderOwnerLookup | None = None,
        limits: RequestLimits = DEFAULT_LIMITS,
        public_prefixes: Sequence[str] = PUBLIC_PREFIXES,
    ) -> None:
        self.authenticator = authenticator
        self.job_owner_lookup = job_owner_lookup
        self.recommender_owner_lookup = recommender_owner_lookup
        self.limits = limits
        self.public_prefixes = tuple(public_prefixes)
        self.refusals: Counter[tuple[str, str]] = Counter()

    async def _refuse(
        self, context: grpc.aio.ServicerContext, method: str, code: grpc.StatusCode, reason: str
    ) -> NoReturn:
        self.refusals[(method, code.name)] += 1
        log.info("call refused", extra={"method": method, "code": code.name, "reason": reason})
        await _refuse(context, code, reason)

    async def admit(
        self,
        method: str,
        metadata: Metadata | None,
        request: Message,
        context: grpc.aio.ServicerContext,
    ) -> Principal:
        """The caller, if the call may proceed; otherwise aborts the call with the reason."""
        try:
            principal = self.authenticator.authenticate(metadata, context.auth_context())
        except AuthenticationError as error:
            await self._refuse(context, method, grpc.StatusCode.UNAUTHENTICATED, str(error))
        try:
            validate_request(request, self.limits)
        except InvalidRequestError as error:
            await self._refuse(context, method, grpc.StatusCode.INVALID_ARGUMENT, str(error))
        decision = authorize(principal, method, request, self.job_owner_lookup, self.recommender_owner_lookup)
        if decision.code is not None:
            await self._refuse(context, method, decision.code, decision.reason)
        return principal

    def wrap(self, handler: grpc.RpcMethodHandler, method: str, metadata: Metadata) -> grpc.RpcMethodHandler:
        if method.startswith(self.public_prefixes):
            return handler

        @asynccontextmanager
        async def as_admitted_caller(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
            principal = await self.admit(method, metadata, request, context)
            token = current_principal.set(principal)
            try:
                yield
            finally:
                current_principal.reset(token)

        wrapped = unary_calls_within(handler, as_admitted_caller)
        return wrapped or self._refusing_stream_handler(method, handler)

    def _refusing_stream_handler(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        async def refuse(request_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
            await self._refuse(
                context, method, grpc.StatusCode.PERMISSION_DENIED, f"no authorisation rule for {method}"
            )

        factory = (
            grpc.stream_unary_rpc_method_handler
            if handler.stream_unary is not None
            else grpc.stream_stream_rpc_method_handler
        )
        return factory(
            refuse,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
