"""A store a service depends on is unreachable: the call fails with UNAVAILABLE, so clients retry.

A Borgmaster that cannot reach its checkpoint store (PostgreSQL, Borg §3.1), an Autopilot
replica whose Redis is down, a Monitoring API whose history tables cannot be read: none of
these is the caller's fault and none is final. The honest answer is gRPC UNAVAILABLE with
the store named and ``cellpilot-error-reason: STORE_UNAVAILABLE`` — a status every client
retries within its deadline — never UNKNOWN with a driver traceback, nor FAILED_PRECONDITION
("not the master"), which clients take as final.

:func:`store_of` recognises the drivers' connection failures; :class:`StoreUnavailable` is what
code that knows it was talking to a store raises; :class:`StoreOutageInterceptor` turns either,
escaping a handler, into the UNAVAILABLE reply.
"""

from __future__ import annotations

import errno
import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiokafka.errors
import asyncpg.exceptions
import grpc
import redis.exceptions
import sqlalchemy.exc

from cellpilot.platform.error_reasons import STORE_UNAVAILABLE, reason_metadata
from cellpilot.platform.grpc_handlers import HandlerWrappingInterceptor, Metadata, unary_unary_within

log = logging.getLogger(__name__)

POSTGRES = "PostgreSQL"
REDIS = "Redis"
KAFKA = "Kafka"

_POSTGRES_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.PostgresConnectionError,  # class 08: connection exceptions
    asyncpg.exceptions.OperatorInterventionError,  # class 57: shutting down, cannot connect now
    asyncpg.exceptions.InsufficientResourcesError,  # class 53: too many connections
    sqlalchemy.exc.OperationalError,
)
_REDIS_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
_KAFKA_ERRORS = (aiokafka.errors.KafkaConnectionError, aiokafka.errors.KafkaTimeoutError)
_NETWORK_ERRNOS = frozenset(
    {errno.ECONNREFUSED, errno.ECONNRESET, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ETIMEDOUT}
)


class StoreUnavailable(Exception):  # noqa: N818 - a condition of the world, named for what it is
    """``store`` could not be reached (or failed mid-request); retrying later may succeed."""

    def __init__(self, store: str, cause: BaseException | str) -> None:
        self.store = store
        self.detail = cause if isinstance(cause, str) else describe(cause)
        super().__init__(f"{store} is unreachable: {self.detail}")


def describe(error: BaseException) -> str:
    """``ConnectionRefusedError: [Errno 111] Connect call failed ...`` (one line)."""
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _is_network_failure(error: BaseException) -> bool:
    if isinstance(error, ConnectionError | TimeoutError | socket.gaierror):
        return True
    return isinstance(error, OSError) and error.errno in _NETWORK_ERRNOS


def store_of(error: BaseException, default: str | None = None) -> str | None:
    """The store ``error`` says is unreachable, or None if it is not a store outage.

    Driver errors name their store (PostgreSQL, Redis, Kafka); a bare network failure (a
    refused connection, a timeout) is blamed on ``default``, the store the caller was using,
    or is not recognised when no default is given. Wrapped errors are followed through their
    causes (SQLAlchemy wraps asyncpg's).
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, StoreUnavailable):
            return current.store
        if isinstance(current, _POSTGRES_ERRORS) or (
            isinstance(current, sqlalchemy.exc.DBAPIError) and current.connection_invalidated
        ):
            return POSTGRES
        if isinstance(current, _REDIS_ERRORS):
            return REDIS
        if isinstance(current, _KAFKA_ERRORS):
            return KAFKA
        if default is not None and _is_network_failure(current):
            return default
        orig = getattr(current, "orig", None)
        current = orig if isinstance(orig, BaseException) else (current.__cause__ or current.__context__)
    return None


class StoreOutageInterceptor(HandlerWrappingInterceptor):
    """Answers UNAVAILABLE, naming the store, when a unary handler fails for a store outage.

    ``default_store`` is the store a bare network failure is blamed on (the one the service
    keeps its state in). Other exceptions pass through untouched.
    """

    def __init__(self, default_store: str) -> None:
        self.default_store = default_store

    def wrap(self, handler: grpc.RpcMethodHandler, method: str, metadata: Metadata) -> grpc.RpcMethodHandler:
        if handler.unary_unary is None:
            return handler
        default_store = self.default_store

        @asynccontextmanager
        async def outage_as_unavailable(
            request: Any, context: grpc.aio.ServicerContext
        ) -> AsyncIterator[None]:
            try:
                yield
            except grpc.aio.AbortError:
                raise  # the handler's own refusal
            except Exception as error:
                store = store_of(error, default_store)
                if store is None:
                    raise
                detail = error.detail if isinstance(error, StoreUnavailable) else describe(error)
                log.warning("store unavailable", extra={"method": method, "store": store, "error": detail})
                await context.abort(
                    grpc.StatusCode.UNAVAILABLE,
                    f"{store} is unreachable ({detail}); retry later",
                    trailing_metadata=reason_metadata(STORE_UNAVAILABLE),
                )
                raise AssertionError("unreachable") from error  # pragma: no cover

        return unary_unary_within(handler, outage_as_unavailable)
