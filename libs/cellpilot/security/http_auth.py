"""The same authentication and authorisation for HTTP endpoints (the FastAPI dashboard).

Scripts send ``Authorization: Bearer <token>``; a missing or bad token is 401 with
``WWW-Authenticate: Bearer``, a refused action 403 with the policy's reason. HTTPS services do
not ask for client certificates (``SecuritySettings.uvicorn_ssl_options``), so over HTTP a
bearer token is the one credential (the dashboard adds browser sessions on top of it):

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

NO_BEARER_TOKEN = "no credentials: send 'Authorization: Bearer <token>'"


def bearer_principal(authenticator: Authenticator, request: Request) -> Principal:
    """The Principal of the request's bearer token; 401 (with the reason) without a valid one."""
    values = request.headers.getlist("authorization")
    if not values:
        raise HTTPException(401, detail=NO_BEARER_TOKEN, headers={"WWW-Authenticate": "Bearer"})
    try:
        return authenticator.authenticate([("authorization", value) for value in values], {})
    except AuthenticationError as error:
        raise HTTPException(401, detail=str(error), headers={"WWW-Authenticate": "Bearer"}) from None


def http_principal_dependency(authenticator: Authenticator) -> Callable[[Request], Principal]:
    """A FastAPI dependency answering the caller's Principal, or 401."""

    def principal(request: Request) -> Principal:
        return bearer_principal(authenticator, request)

    return principal


def raise_for_decision(decision: Decision) -> None:
    """403 (or 401) with the policy's reason unless the decision allows the action."""
    if decision.allowed:
        return
    status = 401 if decision.code is not None and decision.code.name == "UNAUTHENTICATED" else 403
    raise HTTPException(status, detail=decision.reason)
