"""The Python client of Cellpilot's v1 gRPC API: async (:class:`CellpilotClient`) and blocking
(:class:`SyncCellpilotClient`), finding the Borgmaster master, retrying with backoff, and
raising the exceptions of :mod:`cellpilot.client.errors`."""

from cellpilot.client.async_client import CellpilotClient, new_request_id
from cellpilot.client.errors import (
    AlreadyExistsError,
    CellpilotError,
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    QuotaExceededError,
    UnauthenticatedError,
    UnavailableError,
)
from cellpilot.client.failover import RetryPolicy
from cellpilot.client.sync_client import SyncCellpilotClient

__all__ = [
    "AlreadyExistsError",
    "CellpilotClient",
    "CellpilotError",
    "ConflictError",
    "InvalidArgumentError",
    "NotFoundError",
    "PermissionDeniedError",
    "QuotaExceededError",
    "RetryPolicy",
    "SyncCellpilotClient",
    "UnauthenticatedError",
    "UnavailableError",
    "new_request_id",
]
