"""The same authentication and authorisation for HTTP endpoints (the FastAPI dashboard).

Browsers and scripts send ``Authorization: Bearer <token>``; a missing or bad token is 401
with ``WWW-Authenticate: Bearer``, a refused action 403 with the policy's reason:

    require_user = http_principal_dependency(security.authenticator())
    app = FastAPI(dependencies=[Depends(require_user)])          # every route authenticated
    def kill(job_id: str, principal: Principal = Depends(require_user)) -> ...:
        raise_for_decision(authorize(principal, KILL_JOB, KillJobRequest(job_id=job_id)))
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import HTTPException, Request

from cellpilot.security.authentication import AuthenticationError, Authenticator
from cellpilot.security.identity import Principal
from cellpilot.security.policy import Decision


def http_principal_dependency(authenticator: Authenticator) -> Callable[[Request], Principal]:
    """A FastAPI dependency answering the caller's Principal, or 401."""

    def principal(request: Request) -> Principal:
        metadata = [("authorization", value) for value in request.headers.getlist("authorization")]
        try:
            return authenticator.authenticate(metadata, {})
        except AuthenticationError as error:
            raise HTTPException(401, detail=str(error), headers={"WWW-Authenticate": "Bearer"}) from None

    return principal


def raise_for_decision(decision: Decision) -> None:
    """403 (or 401) with the policy's reason unless the decision allows the action."""
    if decision.allowed:
        return
    status = 401 if decision.code is not None and decision.code.name == "UNAUTHENTICATED" else 403
    raise HTTPException(status, detail=decision.reason)
