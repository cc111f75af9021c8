"""The client's exceptions: one class per way a call can fail, with the server's message."""

from __future__ import annotations

import grpc


class CellpilotError(Exception):
    """Base of every client error; ``code`` is the gRPC status, ``details`` the server's words."""

    def __init__(self, code: grpc.StatusCode, details: str, method: str = "") -> None:
        super().__init__(f"{method}: {details}" if method else details)
        self.code = code
        self.details = details
        self.method = method


class InvalidArgumentError(CellpilotError):
    """The request is malformed; the message names the field."""


class NotFoundError(CellpilotError):
    """The job, task, machine or recommender does not exist."""


class AlreadyExistsError(CellpilotError):
    """A different object with that name exists."""


class QuotaExceededError(CellpilotError):
    """Admission refused the job: the message names the resource and the amount (Borg §2.5)."""


class ConflictError(CellpilotError):
    """A precondition failed: stale spec version, stale fencing token, illegal transition."""


class UnavailableError(CellpilotError):
    """No replica answered (or none is master) within the retry budget."""


class UnauthenticatedError(CellpilotError):
    """No or bad credentials."""


class PermissionDeniedError(CellpilotError):
    """The caller may not do this (e.g. change another user's job)."""


_BY_CODE: dict[grpc.StatusCode, type[CellpilotError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: QuotaExceededError,
    grpc.StatusCode.FAILED_PRECONDITION: ConflictError,
    grpc.StatusCode.ABORTED: ConflictError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: UnavailableError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
}


def error_from_status(code: grpc.StatusCode, details: str, method: str = "") -> CellpilotError:
    return _BY_CODE.get(code, CellpilotError)(code, details, method)
