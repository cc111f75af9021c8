"""Why the Borgmaster refuses a request: a returned value naming the field, never an exception."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Code(enum.Enum):
    """Maps one to one onto the gRPC status the service answers with."""

    INVALID_ARGUMENT = "invalid-argument"  # the request is malformed; ``field`` names the bad field
    NOT_FOUND = "not-found"
    ALREADY_EXISTS = "already-exists"
    FAILED_PRECONDITION = "failed-precondition"  # valid, but not in the current state
    RESOURCE_EXHAUSTED = "resource-exhausted"  # over quota (Borg §2.5)


@dataclass(frozen=True)
class Rejection:
    code: Code
    field: str  # path of the offending field in the request, e.g. "spec.task.limits.memory_bytes"
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


def invalid(field: str, message: str) -> Rejection:
    return Rejection(Code.INVALID_ARGUMENT, field, message)
