"""The actuator settles a refused UpdateJob by the status code and the server's reason, never by
the message's words (docs/architecture.md rule 7: a fencing conflict is a result)."""

from __future__ import annotations

import grpc
import pytest

from cellpilot.api.v1 import actuation_pb2
from cellpilot.client.errors import CellpilotError, error_from_status
from cellpilot.platform.error_reasons import FENCED, NO_MASTER, NOT_MASTER, STALE_SPEC_VERSION
from cellpilot_services.actuator.update_request import is_transient, refusal_outcome

CODE = grpc.StatusCode


def _refusal(code: grpc.StatusCode, reason: str, details: str = "some words") -> CellpilotError:
    return error_from_status(code, details, "/cellpilot.api.v1.Borgmaster/UpdateJob", reason)


@pytest.mark.parametrize(
    ("code", "reason", "details", "outcome"),
    [
        pytest.param(
            CODE.FAILED_PRECONDITION, FENCED, "", actuation_pb2.ACTUATION_OUTCOME_FENCED, id="fenced"
        ),
        pytest.param(
            CODE.FAILED_PRECONDITION,
            STALE_SPEC_VERSION,
            "",
            actuation_pb2.ACTUATION_OUTCOME_CONFLICT,
            id="stale-spec-version",
        ),
        pytest.param(
            CODE.FAILED_PRECONDITION,
            "",
            "fencing_token: mentioned in words only",
            actuation_pb2.ACTUATION_OUTCOME_INVALID,
            id="words-are-not-a-reason",
        ),
        pytest.param(
            CODE.FAILED_PRECONDITION, "", "job is dead", actuation_pb2.ACTUATION_OUTCOME_INVALID, id="dead"
        ),
        pytest.param(
            CODE.INVALID_ARGUMENT, FENCED, "", actuation_pb2.ACTUATION_OUTCOME_INVALID, id="not-a-conflict"
        ),
        pytest.param(CODE.NOT_FOUND, "", "no job", actuation_pb2.ACTUATION_OUTCOME_INVALID, id="not-found"),
    ],
)
def test_a_refusal_settles_by_its_code_and_reason(
    code: grpc.StatusCode, reason: str, details: str, outcome: int
) -> None:
    assert refusal_outcome(_refusal(code, reason, details)) == outcome


@pytest.mark.parametrize(
    ("code", "reason", "details", "transient"),
    [
        pytest.param(CODE.UNAVAILABLE, NO_MASTER, "", True, id="no-master"),
        pytest.param(CODE.DEADLINE_EXCEEDED, "", "", True, id="deadline"),
        pytest.param(CODE.FAILED_PRECONDITION, NOT_MASTER, "", True, id="follower"),
        pytest.param(CODE.FAILED_PRECONDITION, "", "not the master", False, id="words-are-not-a-reason"),
        pytest.param(CODE.FAILED_PRECONDITION, FENCED, "", False, id="fenced"),
        pytest.param(CODE.INVALID_ARGUMENT, "", "", False, id="invalid"),
    ],
)
def test_only_an_unreachable_or_unknown_master_is_retried(
    code: grpc.StatusCode, reason: str, details: str, transient: bool
) -> None:
    assert is_transient(_refusal(code, reason, details)) is transient
