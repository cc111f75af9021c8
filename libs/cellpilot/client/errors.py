"""The client's exceptions: one class per way a call can fail, with the server's message.

Which gRPC status becomes which exception, and which are retried, is the table in
:mod:`cellpilot.client`; :func:`error_from_status` is that table in code.
"""

from __future__ import annotations

import re

import grpc

from cellpilot.platform.error_reasons import QUOTA_EXCEEDED

# gRPC's own message-size refusal says "... larger than max (<size> vs. <limit>)"; only the
# numbers are read from it (for the message), never the kind of error.
_SIZES = re.compile(r"\((\d+) vs\. (\d+)\)")


class CellpilotError(Exception):
    """Base of every client error; ``code`` is the gRPC status, ``details`` the server's words,
    ``reason`` the server's ``cellpilot-error-reason`` (empty if it gave none)."""

    def __init__(self, code: grpc.StatusCode, details: str, method: str = "", reason: str = "") -> None:
        super().__init__(f"{method}: {details}" if method else details)
        self.code = code
        self.details = details
        self.method = method
        self.reason = reason


class InvalidArgumentError(CellpilotError):
    """The request is malformed; the message names the field."""


class NotFoundError(CellpilotError):
    """The job, task, machine or recommender does not exist."""


class AlreadyExistsError(CellpilotError):
    """A different object with that name exists, or the request id was already used by another
    request (``reason`` REQUEST_ID_REUSED; the message says which method it was used for)."""


class QuotaExceededError(CellpilotError):
    """Admission refused the job: the message names the resource and the amount (Borg §2.5)."""


class RequestTooLargeError(CellpilotError):
    """The request is larger than the server accepts (gRPC's message-size limit, 4 MiB by
    default) — a property of the message, not of anyone's quota. ``size_bytes`` and
    ``limit_bytes`` say by how much (None where unknown)."""

    def __init__(
        self,
        code: grpc.StatusCode,
        details: str,
        method: str = "",
        reason: str = "",
        size_bytes: int | None = None,
        limit_bytes: int | None = None,
    ) -> None:
        sizes = _SIZES.search(details)
        if sizes is not None:
            size_bytes = size_bytes or int(sizes.group(1))
            limit_bytes = limit_bytes or int(sizes.group(2))
        size = f"{size_bytes:,} bytes" if size_bytes is not None else "too large"
        limit = f"{limit_bytes:,} bytes" if limit_bytes is not None else "a smaller size"
        words = f"the request is {size}; the server accepts at most {limit}"
        super().__init__(code, f"{words} ({details})" if details else words, method, reason)
        self.size_bytes = size_bytes
        self.limit_bytes = limit_bytes


class ConflictError(CellpilotError):
    """A precondition failed: stale spec version, stale fencing token, illegal transition
    (``reason`` STALE_SPEC_VERSION / FENCED for the first two; NOT_MASTER when a follower
    refused a write and the master it named could not be followed)."""


class UnavailableError(CellpilotError):
    """No replica took the call within the retry budget: unreachable, no master elected, or a
    store it needs down (``reason`` NO_MASTER / STORE_UNAVAILABLE; the message says which)."""


class UnauthenticatedError(CellpilotError):
    """No or bad credentials."""


class PermissionDeniedError(CellpilotError):
    """The caller may not do this (e.g. change another user's job)."""


_BY_CODE: dict[grpc.StatusCode, type[CellpilotError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    grpc.StatusCode.FAILED_PRECONDITION: ConflictError,
    grpc.StatusCode.ABORTED: ConflictError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: UnavailableError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
}


def error_from_status(
    code: grpc.StatusCode, details: str, method: str = "", reason: str = "", request_bytes: int | None = None
) -> CellpilotError:
    """The exception for a failed call. RESOURCE_EXHAUSTED is a quota refusal only when the server
    says so (``reason`` QUOTA_EXCEEDED, which every Cellpilot quota refusal carries); without it,
    it is gRPC's message-size check refusing a request of ``request_bytes``."""
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        if reason == QUOTA_EXCEEDED:
            return QuotaExceededError(code, details, method, reason)
        return RequestTooLargeError(code, details, method, reason, size_bytes=request_bytes)
    return _BY_CODE.get(code, CellpilotError)(code, details, method, reason)
