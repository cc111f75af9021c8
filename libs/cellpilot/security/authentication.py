"""Turning a call's credentials into a :class:`Principal`.

Two sources, combined:

- the verified client certificate of an mTLS connection (gRPC only exposes it after the TLS
  layer checked it against the CA): its SPIFFE service URI (else common name) is the
  service identity, its ``spiffe://cellpilot.local/machines/<glob>`` URIs the machines a
  Borglet may report for;
- an ``authorization: Bearer <token>`` header: a user token names the person and their
  capabilities; a service token (for plaintext development, where there are no
  certificates) names a service identity.

A certificate of the ``client`` kind identifies a program (the CLI), not a person, so it must
come with a user token. A service token on an mTLS connection must name the certificate's
identity.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from cellpilot.security.certificates import SPIFFE_MACHINES_PREFIX, SPIFFE_SERVICE_PREFIX
from cellpilot.security.identity import Principal
from cellpilot.security.tokens import TokenError, TokenSigner

AUTHORIZATION_HEADER = "authorization"
TRANSPORT_ONLY_KINDS = frozenset({"client"})

Metadata = Sequence[tuple[str, str | bytes]]
AuthContext = Mapping[str, Sequence[bytes]]


class AuthenticationError(Exception):
    """The call has no valid credentials; the message says what is wrong (never the secret)."""


def bearer_token(metadata: Metadata | None) -> str | None:
    """The token of the one ``authorization: Bearer`` header, None if absent."""
    values = [v for k, v in (metadata or ()) if k.lower() == AUTHORIZATION_HEADER]
    if not values:
        return None
    if len(values) > 1:
        raise AuthenticationError("more than one authorization header")
    value = values[0].decode("ascii", "replace") if isinstance(values[0], bytes) else values[0]
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthenticationError("the authorization header must be 'Bearer <token>'")
    return token.strip()


def _texts(auth_context: AuthContext, key: str) -> list[str]:
    return [v.decode("utf-8", "replace") for v in auth_context.get(key, ())]


def certificate_principal(auth_context: AuthContext) -> Principal | None:
    """The service identity of a verified peer certificate, None if the peer sent none."""
    if not auth_context.get("x509_pem_cert") and not auth_context.get("x509_common_name"):
        return None
    uris = _texts(auth_context, "peer_uri") or _texts(auth_context, "x509_subject_alternative_name")
    services = [u.removeprefix(SPIFFE_SERVICE_PREFIX) for u in uris if u.startswith(SPIFFE_SERVICE_PREFIX)]
    names = _texts(auth_context, "x509_common_name")
    identity = services[0] if services else (names[0] if names else "")
    if not identity:
        raise AuthenticationError("the client certificate names no identity")
    globs = tuple(
        u.removeprefix(SPIFFE_MACHINES_PREFIX) for u in uris if u.startswith(SPIFFE_MACHINES_PREFIX)
    )
    return Principal(service=identity, machine_globs=globs, authenticated_by="mtls")


class Authenticator:
    """Authenticates calls against one token signer; ``clock`` gives seconds since epoch."""

    def __init__(self, signer: TokenSigner | None, clock: Callable[[], float] = time.time) -> None:
        self.signer = signer
        self.clock = clock

    def authenticate(self, metadata: Metadata | None, auth_context: AuthContext) -> Principal:
        peer = certificate_principal(auth_context)
        token = bearer_token(metadata)
        if token is None:
            if peer is None:
                raise AuthenticationError("no credentials: send 'authorization: Bearer <token>' or use mTLS")
            if peer.service_kind in TRANSPORT_ONLY_KINDS:
                raise AuthenticationError(
                    f"certificate {peer.service!r} identifies a program, not a user: send a bearer token"
                )
            return peer
        if self.signer is None:
            raise AuthenticationError("this server accepts no bearer tokens (no token secret configured)")
        try:
            claims = self.signer.verify(token, self.clock())
        except TokenError as error:
            raise AuthenticationError(f"invalid bearer token: {error}") from None
        if claims.kind == "service":
            if peer is not None and peer.service != claims.subject:
                raise AuthenticationError(
                    f"service token for {claims.subject!r} sent over the certificate of {peer.service!r}"
                )
            return Principal(  # services get rights from the policy, never capabilities
                service=claims.subject,
                machine_globs=peer.machine_globs if peer else claims.machine_globs,
                authenticated_by="mtls+token" if peer else "token",
            )
        service = peer.service if peer and peer.service_kind not in TRANSPORT_ONLY_KINDS else ""
        return Principal(
            user=claims.subject,
            service=service,
            capabilities=frozenset(claims.capabilities),
            machine_globs=peer.machine_globs if peer and service else (),
            authenticated_by="mtls+token" if peer else "token",
        )
