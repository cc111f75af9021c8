"""Signing people into a web page: one-time sign-in links, session cookies and CSRF tokens.

Three kinds of signed value, each with its own key derived from the token secret (so none can
be passed off as another, nor as a bearer token), each in the tokens' sealed format:

- a **sign-in ticket** (``cpl1.…``): the nonce of a one-time sign-in link, minted by
  ``cellpilot dashboard login``. It lives minutes (at most :data:`MAX_TICKET_TTL_S`), names the
  user and capabilities, and the token id it was minted from (revoking that token voids it).
  Signing proves who minted it; that it is used once is the redeemer's job (it records the
  nonce until the ticket expires).
- a **browser session** (``cps1.…``): what the session cookie holds, signed, so any replica
  verifies it without a session table: user, capabilities, expiry, a session id, and the token
  id it descends from. Listing that token id (or the session id) in ``revoked-tokens`` refuses
  it like the token itself.
- a **CSRF token**: an HMAC of the session id, so a form proves it was rendered for the session
  that posts it (no per-session state to keep).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cellpilot.security.tokens import NAME_PATTERN, TokenClaims, TokenError, TokenSigner, seal, unseal

TICKET_PREFIX = "cpl1"
SESSION_PREFIX = "cps1"
MAX_TICKET_TTL_S = 3600
DEFAULT_TICKET_TTL_S = 600


def _now(now_s: float | None) -> float:
    return time.time() if now_s is None else now_s


def _strings(value: object, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TokenError(f"{what} must be a list of strings")
    return tuple(value)


def _whole(value: object, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TokenError(f"{what} must be a whole number")
    return value


def _text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise TokenError(f"{what} must be a string")
    return value


def _claims(value: object, what: str) -> dict[str, object]:
    if not isinstance(value, dict):
        raise TokenError(f"{what} claims are not an object")
    subject = value.get("sub")
    if not isinstance(subject, str) or not NAME_PATTERN.fullmatch(subject):
        raise TokenError(f"{what} names no valid user")
    return value


def _grant(data: dict[str, object], what: str) -> dict[str, Any]:
    """The claims a sign-in link and a session both carry: who, what they may do, until when, and
    the token they descend from."""
    return {
        "subject": _text(data["sub"], f"{what} user"),
        "capabilities": _strings(data.get("caps", []), f"{what} capabilities"),
        "expires_at": _whole(data.get("exp"), f"{what} expiry"),
        "token_id": _text(data.get("jti"), f"{what} token id"),
    }


@dataclass(frozen=True)
class SignInTicket:
    """What a one-time sign-in link grants: a session for ``subject`` if used before ``expires_at``."""

    subject: str
    capabilities: tuple[str, ...]
    expires_at: int  # seconds since epoch
    nonce: str  # what the redeemer records, so the link works once
    token_id: str  # the token it descends from (revocable); the nonce when minted for a name
    session_expires_at: int = 0  # the session may not outlive this (the source token's expiry); 0 = no cap


@dataclass(frozen=True)
class BrowserSession:
    subject: str
    capabilities: tuple[str, ...]
    expires_at: int  # seconds since epoch
    session_id: str
    token_id: str


class BrowserSessionSigner:
    """Mints and opens tickets and sessions with keys derived from one token signer's secret."""

    def __init__(self, signer: TokenSigner) -> None:
        self.signer = signer
        self._ticket_key = signer.derived_key("sign-in-ticket")
        self._session_key = signer.derived_key("browser-session")
        self._csrf_key = signer.derived_key("csrf")

    # ------------------------------------------------------------------ tickets
    def ticket_for(
        self,
        subject: str,
        capabilities: Iterable[str] = (),
        *,
        token_id: str = "",
        session_expires_at: int = 0,
        ttl_s: int = DEFAULT_TICKET_TTL_S,
        now_s: float | None = None,
    ) -> str:
        if not 0 < ttl_s <= MAX_TICKET_TTL_S:
            raise TokenError(f"a sign-in link lives between 1 s and {MAX_TICKET_TTL_S} s, not {ttl_s}")
        if not NAME_PATTERN.fullmatch(subject):
            raise TokenError(f"{subject!r} is not a valid user name")
        now = int(_now(now_s))
        nonce = secrets.token_urlsafe(18)
        claims = {
            "sub": subject,
            "caps": sorted(set(capabilities)),
            "iat": now,
            "exp": now + ttl_s,
            "nonce": nonce,
            "jti": token_id or nonce,
            "sexp": session_expires_at,
        }
        return seal(self._ticket_key, TICKET_PREFIX, claims)

    def ticket_for_token(
        self, token: str, ttl_s: int = DEFAULT_TICKET_TTL_S, now_s: float | None = None
    ) -> str:
        """A link for whoever ``token`` names, bound to it: revoking the token voids link and session."""
        claims: TokenClaims = self.signer.verify(token, now_s)
        if claims.kind != "user":
            raise TokenError("a service token cannot sign a person in")
        return self.ticket_for(
            claims.subject,
            claims.capabilities,
            token_id=claims.token_id,
            session_expires_at=claims.expires_at,
            ttl_s=ttl_s,
            now_s=now_s,
        )

    def open_ticket(self, text: str, now_s: float | None = None) -> SignInTicket:
        """The ticket's grant if ours, unexpired, not too long-lived and not revoked (TokenError)."""
        data = _claims(unseal(self._ticket_key, TICKET_PREFIX, text, "sign-in link"), "sign-in link")
        ticket = SignInTicket(
            **_grant(data, "sign-in link"),
            nonce=_text(data.get("nonce"), "sign-in link nonce"),
            session_expires_at=_whole(data.get("sexp", 0), "sign-in link session expiry"),
        )
        issued = _whole(data.get("iat"), "sign-in link issue time")
        if ticket.expires_at - issued > MAX_TICKET_TTL_S or len(ticket.nonce) < 16:
            raise TokenError("sign-in link is not a one-time link (too long-lived, or no nonce)")
        if _now(now_s) >= ticket.expires_at:
            raise TokenError("sign-in link has expired: ask for a new one (`cellpilot dashboard login`)")
        if ticket.token_id in self.signer.revoked:
            raise TokenError("sign-in link belongs to a revoked token")
        return ticket

    # ------------------------------------------------------------------ sessions
    def session_for(
        self,
        subject: str,
        capabilities: Iterable[str],
        token_id: str,
        ttl_s: int,
        cap_at: int = 0,
        now_s: float | None = None,
    ) -> tuple[str, BrowserSession]:
        """A new session (sealed cookie value, and what it holds); never outlives ``cap_at``."""
        now = int(_now(now_s))
        expires = now + ttl_s if not cap_at else min(now + ttl_s, cap_at)
        session = BrowserSession(
            subject, tuple(sorted(set(capabilities))), expires, secrets.token_urlsafe(18), token_id
        )
        claims = {
            "sub": session.subject,
            "caps": list(session.capabilities),
            "exp": session.expires_at,
            "sid": session.session_id,
            "jti": session.token_id,
        }
        return seal(self._session_key, SESSION_PREFIX, claims), session

    def open_session(self, text: str, now_s: float | None = None) -> BrowserSession:
        data = _claims(unseal(self._session_key, SESSION_PREFIX, text, "session"), "session")
        session = BrowserSession(**_grant(data, "session"), session_id=_text(data.get("sid"), "session id"))
        if _now(now_s) >= session.expires_at:
            raise TokenError("session has expired: sign in again")
        if session.token_id in self.signer.revoked or session.session_id in self.signer.revoked:
            raise TokenError("session belongs to a revoked token")
        return session

    # ------------------------------------------------------------------ CSRF
    def csrf_token(self, session: BrowserSession) -> str:
        return hmac.new(self._csrf_key, session.session_id.encode(), hashlib.sha256).hexdigest()

    def csrf_matches(self, session: BrowserSession, presented: str | None) -> bool:
        return bool(presented) and hmac.compare_digest(
            self.csrf_token(session).encode(), (presented or "").encode("utf-8", "replace")
        )
