"""Per-user (and, for plaintext development, per-service) bearer tokens signed with HMAC-SHA256.

Why signed tokens rather than stored hashes: every replica of every service can verify a
token locally with one secret (``token-secret.key`` in the certs directory), without a shared
token table to keep in sync or reach on each call, and verification is one constant-time
HMAC comparison. The price is revocation: a token stays valid until it expires, unless its
id is listed in ``revoked-tokens`` in the certs directory or the secret is rotated (which
voids every token). Tokens therefore expire (30 days by default). Whoever holds the secret can
mint tokens, so it lives only where servers run, readable only by their user (mode 0600).

Format: ``cpt1.<base64url(JSON claims)>.<base64url(HMAC-SHA256(secret, "cpt1." + claims))>``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import secrets
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from cellpilot.security.certificates import write_private_file

TOKEN_SECRET_FILE = "token-secret.key"
REVOKED_TOKENS_FILE = "revoked-tokens"
TOKEN_PREFIX = "cpt1"
MAX_TOKEN_CHARS = 4096
SECRET_BYTES = 32
DEFAULT_TTL_S = 30 * 24 * 3600
NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")


class TokenError(ValueError):
    """A token that is malformed, forged, expired or revoked (the message says which)."""


@dataclass(frozen=True)
class TokenClaims:
    """What a token asserts. ``kind`` is ``user`` (a person) or ``service`` (a service identity)."""

    subject: str
    kind: str = "user"
    capabilities: tuple[str, ...] = ()
    machine_globs: tuple[str, ...] = ()  # service tokens of Borglets: machines they report for
    issued_at: int = 0  # seconds since epoch
    expires_at: int = 0  # seconds since epoch; 0 = never
    token_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def __post_init__(self) -> None:
        if self.kind not in ("user", "service"):
            raise TokenError(f"token kind must be user or service, got {self.kind!r}")
        if not NAME_PATTERN.fullmatch(self.subject):
            raise TokenError(f"token subject {self.subject!r} is not a valid name")

    def to_json(self) -> dict[str, object]:
        return {
            "sub": self.subject,
            "kind": self.kind,
            "caps": list(self.capabilities),
            "machines": list(self.machine_globs),
            "iat": self.issued_at,
            "exp": self.expires_at,
            "jti": self.token_id,
        }

    @classmethod
    def from_json(cls, data: object) -> TokenClaims:
        """Strict: every claim must have its JSON type (a token is ours, so anything else is a bug)."""
        if not isinstance(data, dict):
            raise TokenError("token claims are not an object")
        sub, kind, jti = data.get("sub"), data.get("kind", "user"), data.get("jti", "")
        caps, machines = data.get("caps", []), data.get("machines", [])
        iat, exp = data.get("iat", 0), data.get("exp", 0)
        if not (isinstance(sub, str) and isinstance(kind, str) and isinstance(jti, str)):
            raise TokenError("token claims sub, kind and jti must be strings")
        if not all(isinstance(v, list) and all(isinstance(i, str) for i in v) for v in (caps, machines)):
            raise TokenError("token claims caps and machines must be lists of strings")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (iat, exp)):
            raise TokenError("token claims iat and exp must be whole numbers")
        return cls(sub, kind, tuple(caps), tuple(machines), iat, exp, jti)


def _b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _b64decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _signature(key: bytes, prefix: str, payload: str) -> str:
    return _b64encode(hmac.new(key, f"{prefix}.{payload}".encode("ascii"), hashlib.sha256).digest())


def seal(key: bytes, prefix: str, claims: object) -> str:
    """``<prefix>.<base64url(JSON claims)>.<base64url(HMAC-SHA256(key, prefix + "." + claims))>``."""
    payload = _b64encode(json.dumps(claims, separators=(",", ":")).encode())
    return f"{prefix}.{payload}.{_signature(key, prefix, payload)}"


def unseal(key: bytes, prefix: str, text: str, what: str) -> object:
    """The JSON claims of a value :func:`seal` made with ``key`` and ``prefix``; TokenError if it
    is malformed or its signature is not ours (``what`` names the value in the message)."""
    if len(text) > MAX_TOKEN_CHARS:
        raise TokenError(f"{what} is too long")
    parts = text.split(".")
    if len(parts) != 3 or parts[0] != prefix:
        raise TokenError(f"not a Cellpilot {what} (expected {prefix}.<claims>.<signature>)")
    _, payload, signature = parts
    if not hmac.compare_digest(
        signature.encode("ascii", "replace"), _signature(key, prefix, payload).encode()
    ):
        raise TokenError(f"{what} signature does not match (forged, or signed with another secret)")
    try:
        return json.loads(_b64decode(payload))
    except (binascii.Error, ValueError) as error:  # JSONDecodeError is a ValueError
        raise TokenError(f"{what} claims are unreadable: {error}") from None


class TokenSigner:
    """Issues and verifies tokens with one secret; ``revoked`` holds token ids refused anyway."""

    def __init__(self, secret: bytes, revoked: Iterable[str] = ()) -> None:
        if len(secret) < 16:
            raise ValueError("the token secret must be at least 16 bytes")
        self._secret = secret
        self.revoked = frozenset(revoked)

    def derived_key(self, purpose: str) -> bytes:
        """A key for another kind of signed value (browser sessions, sign-in links), derived from
        the secret so that one kind can never be passed off as another, nor as a token."""
        return hmac.new(self._secret, f"cellpilot/{purpose}".encode(), hashlib.sha256).digest()

    def issue(self, claims: TokenClaims) -> str:
        return seal(self._secret, TOKEN_PREFIX, claims.to_json())

    def issue_for(
        self,
        subject: str,
        *,
        kind: str = "user",
        capabilities: Iterable[str] = (),
        machine_globs: Iterable[str] = (),
        ttl_s: int = DEFAULT_TTL_S,
        now_s: float | None = None,
    ) -> str:
        now = int(time.time() if now_s is None else now_s)
        return self.issue(
            TokenClaims(
                subject=subject,
                kind=kind,
                capabilities=tuple(sorted(set(capabilities))),
                machine_globs=tuple(machine_globs),
                issued_at=now,
                expires_at=now + ttl_s if ttl_s > 0 else 0,
            )
        )

    def verify(self, token: str, now_s: float | None = None) -> TokenClaims:
        """The token's claims if its signature is ours and it is neither expired nor revoked."""
        claims = TokenClaims.from_json(unseal(self._secret, TOKEN_PREFIX, token, "token"))
        now = time.time() if now_s is None else now_s
        if claims.expires_at and now >= claims.expires_at:
            raise TokenError("token has expired")
        if claims.token_id in self.revoked:
            raise TokenError("token has been revoked")
        return claims


def create_secret(certs_dir: Path) -> bytes:
    """Write a fresh random secret (mode 0600); returns it. Rotating it voids every token."""
    certs_dir.mkdir(parents=True, exist_ok=True)
    secret = secrets.token_bytes(SECRET_BYTES)
    write_private_file(certs_dir / TOKEN_SECRET_FILE, (secret.hex() + "\n").encode())
    return secret


def load_secret(certs_dir: Path) -> bytes:
    path = certs_dir / TOKEN_SECRET_FILE
    try:
        return bytes.fromhex(path.read_text().strip())
    except OSError as error:
        raise TokenError(f"no token secret at {path} (run `cellpilot certs issue`): {error}") from None
    except ValueError:
        raise TokenError(f"{path} does not hold a hex secret") from None


def load_or_create_secret(certs_dir: Path) -> bytes:
    if (certs_dir / TOKEN_SECRET_FILE).exists():
        return load_secret(certs_dir)
    return create_secret(certs_dir)


def load_signer(certs_dir: Path) -> TokenSigner:
    """The signer of a certs directory, with its revocation list (one token id per line)."""
    revoked_path = certs_dir / REVOKED_TOKENS_FILE
    revoked = revoked_path.read_text().split() if revoked_path.exists() else []
    return TokenSigner(load_secret(certs_dir), revoked)


def revoke(certs_dir: Path, token_id: str) -> None:
    with (certs_dir / REVOKED_TOKENS_FILE).open("a") as handle:
        handle.write(token_id + "\n")
