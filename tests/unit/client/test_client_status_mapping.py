"""The client's status -> exception -> retried? table (cellpilot.client's docstring) is what the code does."""

from __future__ import annotations

import grpc
import pytest

import cellpilot.client
from cellpilot.client import errors
from cellpilot.client.errors import (
    QuotaExceededError,
    RequestTooLargeError,
    UnavailableError,
    error_from_status,
)
from cellpilot.client.failover import RETRYABLE, leader_hint
from cellpilot.platform.error_reasons import ERROR_REASON_KEY, LEADER_METADATA_KEY, QUOTA_EXCEEDED, reason_of


def _table() -> list[tuple[str, str, str, str]]:
    """The rows of the docstring's table: (status, reason, exception, retried)."""
    lines = (cellpilot.client.__doc__ or "").splitlines()
    rules = [i for i, line in enumerate(lines) if line.startswith("====")]
    assert len(rules) == 3, "the table has a header rule, a body rule and a closing rule"
    rows = []
    for line in lines[rules[1] + 1 : rules[2]]:
        columns = [c for c in line.split("  ") if c.strip()]
        status, reason = ([*columns[0].strip().split(" ", 1), ""])[:2]
        rows.append((status, reason.strip("()"), columns[-2].strip(), columns[-1].strip()))
    return rows


TABLE = _table()


def test_the_table_covers_every_status_a_call_can_end_with() -> None:
    listed = {status for status, *_ in TABLE}
    assert listed >= {c.name for c in grpc.StatusCode} - {
        "OK",
        "CANCELLED",
        "INTERNAL",
        "DATA_LOSS",
        "UNIMPLEMENTED",
    }


@pytest.mark.parametrize(
    ("status", "reason", "exception", "retried"), TABLE, ids=[f"{r[0]}-{r[1]}" for r in TABLE]
)
def test_each_status_maps_to_the_exception_and_retry_the_table_says(
    status: str, reason: str, exception: str, retried: str
) -> None:
    code = grpc.StatusCode[status]
    if reason == "leader":  # a follower's redirect: followed, not raised
        refusal = grpc.aio.AioRpcError(
            code,
            grpc.aio.Metadata(),
            grpc.aio.Metadata((LEADER_METADATA_KEY, "10.0.0.2:7100")),
            "not the master",
        )
        assert leader_hint(refusal) == "10.0.0.2:7100"
        assert retried == "yes"
        return
    error = error_from_status(code, "the server's words", "SubmitJob", reason)
    assert type(error) is getattr(errors, exception)
    assert (code in RETRYABLE) == (retried == "yes")
    assert (error.code, error.reason, error.method) == (code, reason, "SubmitJob")


def test_resource_exhausted_is_a_quota_refusal_only_when_the_server_says_so() -> None:
    quota = error_from_status(
        grpc.StatusCode.RESOURCE_EXHAUSTED, "spec: over by 2 cores", "SubmitJob", QUOTA_EXCEEDED
    )
    assert isinstance(quota, QuotaExceededError)
    # gRPC's own size check sends no reason: the request was too large, whatever the words say.
    for details in ("Received message larger than max (5242899 vs. 4194304)", "", "over quota"):
        too_large = error_from_status(grpc.StatusCode.RESOURCE_EXHAUSTED, details, "SubmitJob", "", 5_242_899)
        assert isinstance(too_large, RequestTooLargeError)
        assert not isinstance(too_large, QuotaExceededError)
        assert too_large.size_bytes == 5_242_899
    assert "the request is 5,242,899 bytes; the server accepts at most 4,194,304 bytes" in str(
        error_from_status(
            grpc.StatusCode.RESOURCE_EXHAUSTED, "Received message larger than max (5242899 vs. 4194304)"
        )
    )


def test_the_reason_is_read_from_the_trailing_metadata() -> None:
    assert reason_of(((ERROR_REASON_KEY, b"QUOTA_EXCEEDED"), ("other", "x"))) == "QUOTA_EXCEEDED"
    assert reason_of((("other", "x"),)) == ""
    assert reason_of(None) == ""


def test_unavailable_and_deadline_exceeded_are_the_retried_statuses() -> None:
    assert frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}) == RETRYABLE
    assert isinstance(error_from_status(grpc.StatusCode.DEADLINE_EXCEEDED, "too slow"), UnavailableError)
