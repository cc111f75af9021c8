"""The Python client of Cellpilot's v1 gRPC API: async (:class:`CellpilotClient`) and blocking
(:class:`SyncCellpilotClient`), finding the Borgmaster master, retrying with backoff, and
raising the exceptions of :mod:`cellpilot.client.errors`.

What the servers answer, and what the client makes of it (``reason`` is the trailing
metadata ``cellpilot-error-reason``; "retried" means on the next replica, with backoff and
the same request, until the call's :class:`RetryPolicy` budget is spent):

===================================  ========================================  =====================  =======
status (reason)                      sent when                                 exception              retried
===================================  ========================================  =====================  =======
INVALID_ARGUMENT                     a malformed request; names the field      InvalidArgumentError   no
OUT_OF_RANGE                         (not sent by Cellpilot services)          InvalidArgumentError   no
NOT_FOUND                            no such job, task, machine, recommender   NotFoundError          no
ALREADY_EXISTS                       a live job or recommender of that name    AlreadyExistsError     no
ALREADY_EXISTS (REQUEST_ID_REUSED)   request id used for another request       AlreadyExistsError     no
RESOURCE_EXHAUSTED (QUOTA_EXCEEDED)  Borg quota admission refused (§2.5)       QuotaExceededError     no
RESOURCE_EXHAUSTED                   gRPC's message-size check (4 MiB)         RequestTooLargeError   no
FAILED_PRECONDITION                  stale spec version or fencing token, ...  ConflictError          no
FAILED_PRECONDITION (leader)         a follower names the master               (redirect)             yes
ABORTED                              (not sent by Cellpilot services)          ConflictError          no
UNAVAILABLE (NO_MASTER)              no master elected yet (an election)       UnavailableError       yes
UNAVAILABLE (STORE_UNAVAILABLE)      its PostgreSQL or Redis is unreachable    UnavailableError       yes
UNAVAILABLE                          the replica is down or unreachable        UnavailableError       yes
DEADLINE_EXCEEDED                    an attempt outlived its call_timeout_s    UnavailableError       yes
UNAUTHENTICATED                      no or bad token or client certificate     UnauthenticatedError   no
PERMISSION_DENIED                    the caller may not (another's job)        PermissionDeniedError  no
UNKNOWN                              an unexpected server failure              CellpilotError         no
===================================  ========================================  =====================  =======

A redirect is followed at once; a master that is named but cannot be reached within the
budget ends in UnavailableError. A request over the client's ``max_request_bytes`` raises
RequestTooLargeError without being sent. Retrying writes is safe: the server answers a
repeat of a request id (same method, same payload) with the first answer.
"""

from cellpilot.client.async_client import CellpilotClient, new_request_id
from cellpilot.client.errors import (
    AlreadyExistsError,
    CellpilotError,
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    QuotaExceededError,
    RequestTooLargeError,
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
    "RequestTooLargeError",
    "RetryPolicy",
    "SyncCellpilotClient",
    "UnauthenticatedError",
    "UnavailableError",
    "new_request_id",
]
