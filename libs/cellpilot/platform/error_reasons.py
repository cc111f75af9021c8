"""Why a server refused a call, where the gRPC status code alone is ambiguous.

A refusal carries the reason in the trailing metadata key ``cellpilot-error-reason`` (next to
``cellpilot-leader``, which names the master). The client reads it to tell, say, a Borg quota
refusal (Borg §2.5) from gRPC's own message-size check — both RESOURCE_EXHAUSTED — without
parsing the server's words.
"""

from __future__ import annotations

from collections.abc import Iterable

ERROR_REASON_KEY = "cellpilot-error-reason"
# A replica names the elected master here: on a follower's "not the master" refusal
# (FAILED_PRECONDITION) and on the master's own replies.
LEADER_METADATA_KEY = "cellpilot-leader"

QUOTA_EXCEEDED = "QUOTA_EXCEEDED"  # RESOURCE_EXHAUSTED: admission refused the job (Borg §2.5)
REQUEST_ID_REUSED = "REQUEST_ID_REUSED"  # ALREADY_EXISTS: the request id names another request
NO_MASTER = "NO_MASTER"  # UNAVAILABLE: no replica is the elected master right now (an election)
STORE_UNAVAILABLE = "STORE_UNAVAILABLE"  # UNAVAILABLE: a store the service needs cannot be reached
# FAILED_PRECONDITION: a follower refused a write; ``cellpilot-leader`` names the master.
NOT_MASTER = "NOT_MASTER"
# FAILED_PRECONDITION: the write's fencing token is older than one the object has seen: it comes
# from a deposed leader (docs/architecture.md rule 7).
FENCED = "FENCED"
# FAILED_PRECONDITION: the write expected a spec version the job is no longer at.
STALE_SPEC_VERSION = "STALE_SPEC_VERSION"


def reason_metadata(reason: str) -> tuple[tuple[str, str], ...]:
    """Trailing metadata saying ``reason``, for ``context.abort(..., trailing_metadata=...)``."""
    return ((ERROR_REASON_KEY, reason),)


def reason_of(trailing_metadata: Iterable[tuple[str, str | bytes]] | None) -> str:
    """The reason a refusal's trailing metadata gives ("" when it gives none)."""
    for key, value in trailing_metadata or ():
        if key == ERROR_REASON_KEY:
            return value if isinstance(value, str) else value.decode("ascii", "replace")
    return ""


def leader_named(trailing_metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    """The master's address a reply's trailing metadata names, if any."""
    for key, value in trailing_metadata or ():
        if key == LEADER_METADATA_KEY and value:
            return value if isinstance(value, str) else value.decode("ascii", "replace")
    return None
