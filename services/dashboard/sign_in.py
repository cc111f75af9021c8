"""Signing in and out of the dashboard (see :mod:`auth` for the session and CSRF rules).

GET  /sign-in[?next=/path]   the token form
POST /sign-in                a pasted token -> session cookie, back to ``next``
GET  /sign-in/link?ticket=   a one-time link: says whose it is, spends nothing
POST /sign-in/link           spends the link (once: recorded in Redis) -> session cookie
POST /sign-out               ends the session (CSRF token of the session)
GET  /api/session            who the caller is, and the CSRF token scripts send
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import BaseModel

from cellpilot.security.identity import ADMIN
from cellpilot.security.tokens import MAX_TOKEN_CHARS, TokenError
from cellpilot_services.dashboard import sign_in_pages
from cellpilot_services.dashboard.auth import CSRF_FIELD, DashboardAuth, SignInRequiredError, form_fields
from cellpilot_services.dashboard.page_layout import Viewer
from cellpilot_services.dashboard.sign_in_ledger import LedgerUnavailableError

MAX_NEXT_CHARS = 2000


class SessionInfo(BaseModel):
    """The caller as the dashboard sees them."""

    user: str
    admin: bool
    signed_in_with: str  # "session" (browser) or "token" (Authorization: Bearer)
    csrf_token: str  # send as X-CSRF-Token with state-changing requests of a session; "" for tokens


def safe_next(value: str | None) -> str:
    """A path on this dashboard to return to (never another site, never a sign-in page)."""
    if (
        not value
        or len(value) > MAX_NEXT_CHARS
        or not value.startswith("/")
        or value.startswith(("//", "/sign-in", "/sign-out"))
        or "\\" in value
    ):
        return "/"
    return value


def _html(body: str, status: int) -> HTMLResponse:
    return HTMLResponse(body, status_code=status)


def sign_in_router(auth: DashboardAuth) -> APIRouter:
    router = APIRouter()

    def form_page(
        request: Request,
        next_path: str,
        error: str = "",
        notice: str = "",
        status: int = 200,
        probe: bool = False,
    ) -> HTMLResponse:
        return auth.sign_in_form(
            request, lambda csrf: sign_in_pages.sign_in_page(csrf, next_path, error, notice, probe), status
        )

    @router.get("/sign-in", response_class=HTMLResponse, include_in_schema=False)
    async def sign_in_form(
        request: Request,
        next: Annotated[str | None, Query(max_length=MAX_NEXT_CHARS)] = None,
        signed_out: bool = False,
    ) -> HTMLResponse:
        notice = "You are signed out." if signed_out else ""
        return form_page(request, safe_next(next), notice=notice, probe=next is not None)

    @router.post("/sign-in", include_in_schema=False)
    async def sign_in_with_token(request: Request) -> Response:
        fields = await form_fields(request)
        auth.check_sign_in_form(request, fields.get(CSRF_FIELD, ""))
        next_path = safe_next(fields.get("next"))
        token = fields.get("token", "").strip()
        signer = auth.authenticator.signer
        if len(token) > MAX_TOKEN_CHARS:
            return form_page(request, next_path, error="That is not a token (too long).", status=401)
        try:
            if signer is None:
                raise TokenError("this dashboard has no token secret")
            claims = signer.verify(token)
            if claims.kind != "user":
                raise TokenError("a service token cannot sign a person in")
        except TokenError as error:
            return form_page(request, next_path, error=f"Not signed in: {error}.", status=401)
        response = RedirectResponse(next_path, status_code=303)
        auth.start_session(response, claims.subject, claims.capabilities, claims.token_id, claims.expires_at)
        return response

    @router.get("/sign-in/link", response_class=HTMLResponse, include_in_schema=False)
    async def sign_in_link(
        request: Request, ticket: Annotated[str, Query(max_length=MAX_TOKEN_CHARS)]
    ) -> Response:
        sessions = auth.sessions
        try:
            if sessions is None:
                raise TokenError("this dashboard has no token secret")
            grant = sessions.open_ticket(ticket)
            if await auth.ledger.ticket_spent(grant.nonce):
                raise TokenError("this sign-in link has already been used: ask for a new one")
        except TokenError as error:
            return _html(sign_in_pages.link_refused_page(f"{error}."), 410)
        except LedgerUnavailableError:
            return _html(sign_in_pages.link_refused_page("Sign-in links cannot be checked now (Redis)."), 503)
        admin = ADMIN in grant.capabilities
        return auth.sign_in_form(
            request, lambda csrf: sign_in_pages.link_page(csrf, ticket, grant.subject, admin)
        )

    @router.post("/sign-in/link", include_in_schema=False)
    async def redeem_link(request: Request) -> Response:
        fields = await form_fields(request)
        auth.check_sign_in_form(request, fields.get(CSRF_FIELD, ""))
        sessions = auth.sessions
        try:
            if sessions is None:
                raise TokenError("this dashboard has no token secret")
            grant = sessions.open_ticket(fields.get("ticket", ""))
            if not await auth.ledger.spend_ticket(grant.nonce, grant.expires_at):
                raise TokenError("this sign-in link has already been used: ask for a new one")
        except TokenError as error:
            return _html(sign_in_pages.link_refused_page(f"{error}."), 410)
        except LedgerUnavailableError:
            return _html(sign_in_pages.link_refused_page("Sign-in links cannot be used now (Redis)."), 503)
        response = RedirectResponse("/", status_code=303)
        auth.start_session(
            response, grant.subject, grant.capabilities, grant.token_id, grant.session_expires_at
        )
        return response

    @router.post("/sign-out", include_in_schema=False)
    async def sign_out(request: Request) -> Response:
        response = RedirectResponse("/sign-in?signed_out=true", status_code=303)
        try:
            await auth.viewer(request)  # this origin and the session's CSRF token, or 403
        except SignInRequiredError:
            auth.cookies.clear(response, auth.cookies.session)  # nothing to end; the cookie goes anyway
            return response
        session = getattr(request.state, "session", None)
        if session is not None:  # a bearer token has no session to end
            await auth.end_session(response, session)
        return response

    @router.get("/sign-in/status", include_in_schema=False)
    async def sign_in_status(request: Request) -> dict[str, bool]:
        """For the sign-in page's script: is this browser signed in after all? (No 401 to log.)"""
        try:
            await auth.viewer(request)
        except SignInRequiredError:
            return {"signed_in": False}
        return {"signed_in": True}

    @router.get("/api/session", response_model=SessionInfo, tags=["session"])
    async def who_am_i(viewer: Viewer = Depends(auth.viewer)) -> SessionInfo:
        """The caller: user, admin or not, how they signed in, and a session's CSRF token."""
        return SessionInfo(
            user=viewer.user,
            admin=viewer.admin,
            signed_in_with="session" if viewer.csrf_token else "token",
            csrf_token=viewer.csrf_token,
        )

    return router
