"""Who is looking at the dashboard: a browser session (cookie) or an API client (bearer token).

- API clients (curl, scripts) send ``Authorization: Bearer <token>``, checked like every gRPC
  call's token. The dashboard does not ask for client certificates: over HTTPS a bearer token
  or a session is the credential, and the 401 says so.
- Browsers sign in once (a pasted token, or a one-time link from ``cellpilot dashboard login``)
  and then carry a session cookie: ``HttpOnly`` (no script reads it), ``Secure``,
  ``SameSite=Strict`` (no other site's page or link sends it; the sign-in page recovers the
  one case this costs, a dashboard link followed from elsewhere, with a same-origin check),
  ``__Host-`` prefixed (no sibling host can plant one). Its value is a signed session
  (:mod:`cellpilot.security.browser_sessions`): any replica verifies it without a session table.
  The revocation list (``revoked-tokens``) is re-read when it changes, and refuses a session
  whose token, or the session itself, is listed; a signed-out session is recorded in Redis
  until it would have expired.
- Anything that changes state and is authenticated by the cookie must come from a page of this
  origin (``Origin``, else ``Referer``) and carry the session's CSRF token (a form field
  ``csrf_token`` or an ``X-CSRF-Token`` header). Before there is a session (the sign-in forms),
  a random value in a short-lived cookie and the same value in the form do that job.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from fastapi import HTTPException, Request, Response
from fastapi.responses import HTMLResponse

from cellpilot.security.authentication import Authenticator
from cellpilot.security.browser_sessions import BrowserSession, BrowserSessionSigner
from cellpilot.security.http_auth import bearer_principal
from cellpilot.security.identity import ADMIN
from cellpilot.security.tls import SecuritySettings
from cellpilot.security.tokens import REVOKED_TOKENS_FILE, TOKEN_SECRET_FILE, TokenError
from cellpilot_services.dashboard.page_layout import Viewer
from cellpilot_services.dashboard.sign_in_ledger import LedgerUnavailableError, SignInLedger

log = logging.getLogger(__name__)

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "x-csrf-token"
SIGN_IN_FORM_TTL_S = 1800
MAX_FORM_BYTES = 16 * 1024
NOT_SIGNED_IN = "not signed in: sign in at /sign-in, or send 'Authorization: Bearer <token>'"


class SignInRequiredError(Exception):
    """401: answered as a redirect to the sign-in page for a browser, as JSON for API clients."""

    def __init__(self, detail: str, clear_cookie: bool = False) -> None:
        super().__init__(detail)
        self.detail = detail
        self.clear_cookie = clear_cookie


@dataclass(frozen=True)
class CookiePolicy:
    """Cookie names and flags; ``secure`` is False only for plaintext-dev (plain HTTP)."""

    secure: bool

    @property
    def session(self) -> str:
        return "__Host-cellpilot-session" if self.secure else "cellpilot-session"

    @property
    def sign_in(self) -> str:
        return "__Host-cellpilot-sign-in" if self.secure else "cellpilot-sign-in"

    def set(self, response: Response, name: str, value: str, max_age: int) -> None:
        response.set_cookie(
            name, value, max_age=max_age, path="/", secure=self.secure, httponly=True, samesite="strict"
        )

    def clear(self, response: Response, name: str) -> None:
        response.delete_cookie(name, path="/", secure=self.secure, httponly=True, samesite="strict")


def same_origin(request: Request) -> bool:
    """The request was sent by a page of this dashboard (``Origin``, or ``Referer`` without one)."""
    own = f"{request.url.scheme}://{request.headers.get('host', '')}".lower()
    origin = request.headers.get("origin")
    if origin is None:
        referer = urlsplit(request.headers.get("referer", ""))
        origin = f"{referer.scheme}://{referer.netloc}" if referer.netloc else ""
    return origin.lower() == own


async def form_fields(request: Request) -> dict[str, str]:
    """An HTML form's fields (``application/x-www-form-urlencoded``; each field's first value).

    The dashboard's forms are a few short fields, so larger bodies are refused (413)."""
    if not request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        return {}
    body = await request.body()  # Starlette keeps it: a route may read the form again
    if len(body) > MAX_FORM_BYTES:
        raise HTTPException(413, detail=f"a form of more than {MAX_FORM_BYTES} bytes")
    fields = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True, max_num_fields=20)
    return {name: values[0] for name, values in fields.items()}


async def presented_csrf(request: Request) -> str:
    """The CSRF token a request carries: the header, else the form field."""
    return request.headers.get(CSRF_HEADER) or (await form_fields(request)).get(CSRF_FIELD, "")


def cross_site(reason: str) -> HTTPException:
    return HTTPException(403, detail=f"refused as a possible cross-site request forgery: {reason}")


class DashboardAuth:
    """The dashboard's credentials: the token signer (reloaded when the revocation list or the
    secret changes), the sessions derived from it, and the Redis ledger of used links."""

    def __init__(self, security: SecuritySettings, ledger: SignInLedger, session_ttl_s: int) -> None:
        self.security = security
        self.ledger = ledger
        self.session_ttl_s = session_ttl_s
        self.cookies = CookiePolicy(secure=not security.plaintext)
        self._stamp: tuple[tuple[int, int], ...] | None = None
        self._authenticator = Authenticator(None)
        self._sessions: BrowserSessionSigner | None = None
        self._current()

    def _files_stamp(self) -> tuple[tuple[int, int], ...]:
        def stamp(path: Path) -> tuple[int, int]:
            try:
                info = path.stat()
            except OSError:
                return (0, -1)
            return (info.st_mtime_ns, info.st_size)

        return tuple(
            stamp(self.security.certs_dir / name) for name in (TOKEN_SECRET_FILE, REVOKED_TOKENS_FILE)
        )

    def _current(self) -> tuple[Authenticator, BrowserSessionSigner | None]:
        stamp = self._files_stamp()
        if stamp != self._stamp:
            self._authenticator = self.security.authenticator()
            signer = self._authenticator.signer
            self._sessions = BrowserSessionSigner(signer) if signer is not None else None
            self._stamp = stamp
            log.info(
                "token secret and revocation list loaded",
                extra={"revoked": len(signer.revoked) if signer else 0},
            )
        return self._authenticator, self._sessions

    @property
    def authenticator(self) -> Authenticator:
        return self._current()[0]

    @property
    def sessions(self) -> BrowserSessionSigner | None:
        return self._current()[1]

    # ------------------------------------------------------------------ who is asking
    async def viewer(self, request: Request) -> Viewer:
        """The FastAPI dependency of every page and API route: the caller, or SignInRequiredError.

        Also enforced here: a state-changing request made with the session cookie comes from a
        page of this origin and carries the session's CSRF token (403 otherwise)."""
        if request.headers.getlist("authorization"):
            try:
                principal = bearer_principal(self.authenticator, request)
            except HTTPException as error:
                raise SignInRequiredError(str(error.detail)) from None
            viewer = Viewer(user=principal.user or principal.service, admin=principal.is_admin)
        else:
            session, sessions = await self._open_session(request)
            if request.method not in SAFE_METHODS:
                if not same_origin(request):
                    raise cross_site("it does not come from a page of this dashboard")
                if not sessions.csrf_matches(session, await presented_csrf(request)):
                    raise cross_site("it carries no valid CSRF token")
            request.state.session = session
            viewer = Viewer(
                user=session.subject,
                admin=ADMIN in session.capabilities,
                csrf_token=sessions.csrf_token(session),
            )
        request.state.viewer = viewer
        return viewer

    async def _open_session(self, request: Request) -> tuple[BrowserSession, BrowserSessionSigner]:
        cookie = request.cookies.get(self.cookies.session)
        if not cookie:
            raise SignInRequiredError(NOT_SIGNED_IN)
        sessions = self.sessions
        if sessions is None:
            raise SignInRequiredError("this dashboard has no token secret: it cannot check sessions")
        try:
            session = sessions.open_session(cookie)
        except TokenError as error:
            raise SignInRequiredError(f"not signed in: {error}", clear_cookie=True) from None
        try:
            ended = await self.ledger.session_ended(session.session_id)
        except LedgerUnavailableError as error:
            # Sign-out is also enforced by the browser dropping the cookie; the revocation list
            # is the control that does not depend on Redis. Keep serving, and say so.
            log.warning("cannot check for a signed-out session", extra={"error": str(error)})
            ended = False
        if ended:
            raise SignInRequiredError("not signed in: this session was signed out", clear_cookie=True)
        return session, sessions

    # ------------------------------------------------------------------ starting and ending sessions
    def start_session(
        self,
        response: Response,
        subject: str,
        capabilities: tuple[str, ...],
        token_id: str,
        cap_at: int = 0,
    ) -> BrowserSession:
        sessions = self.sessions
        if sessions is None:
            raise TokenError("this dashboard has no token secret: it cannot start sessions")
        value, session = sessions.session_for(subject, capabilities, token_id, self.session_ttl_s, cap_at)
        max_age = max(1, session.expires_at - int(time.time()))
        self.cookies.set(response, self.cookies.session, value, max_age)
        self.cookies.clear(response, self.cookies.sign_in)
        return session

    async def end_session(self, response: Response, session: BrowserSession) -> None:
        try:
            await self.ledger.end_session(session.session_id, session.expires_at)
        except LedgerUnavailableError as error:
            log.warning(
                "cannot record a sign-out (the cookie is cleared anyway)", extra={"error": str(error)}
            )
        self.cookies.clear(response, self.cookies.session)

    # ------------------------------------------------------------------ the sign-in forms' CSRF
    def sign_in_form(self, request: Request, render: Callable[[str], str], status: int = 200) -> HTMLResponse:
        """A sign-in form page: ``render`` gets the double-submit value (the browser's if it has
        one, else a new one), which also goes into a short-lived cookie."""
        value = request.cookies.get(self.cookies.sign_in) or secrets.token_urlsafe(24)
        response = HTMLResponse(render(value), status_code=status)
        self.cookies.set(response, self.cookies.sign_in, value, SIGN_IN_FORM_TTL_S)
        return response

    def check_sign_in_form(self, request: Request, presented: str) -> None:
        if not same_origin(request):
            raise cross_site("the sign-in form was not posted from this dashboard")
        expected = request.cookies.get(self.cookies.sign_in, "")
        if not expected or not secrets.compare_digest(
            expected.encode(), presented.encode("utf-8", "replace")
        ):
            raise cross_site("the sign-in form's token does not match (reload the sign-in page)")
