"""Who is calling: the :class:`Principal` an authenticated call runs as, and where servicers find it.

The security interceptor sets :data:`current_principal` around the servicer call, so a
servicer (or anything it awaits) reads the caller with :func:`require_principal` and never
parses metadata or certificates itself.
"""

from __future__ import annotations

import fnmatch
from contextvars import ContextVar
from dataclasses import dataclass

# Capabilities (Borg §2.5: "users ... administrators ... capability system").
ADMIN = "admin"  # quotas, machines, other users' jobs


@dataclass(frozen=True)
class Principal:
    """An authenticated caller.

    ``user`` is the person a bearer token names ("" for a service calling on its own behalf);
    ``service`` is the service identity of a verified client certificate or a service token
    ("" for a user whose client has no certificate). Both may be set: the dashboard forwarding
    a user's token over its own mTLS connection.
    """

    user: str = ""
    service: str = ""
    capabilities: frozenset[str] = frozenset()
    machine_globs: tuple[str, ...] = ()  # Borglets: the machine ids they may report for
    authenticated_by: str = ""  # "mtls", "token" or "mtls+token"

    @property
    def service_kind(self) -> str:
        """``borglet-r0`` -> ``borglet``: the role a service identity plays."""
        return self.service.split("-", 1)[0]

    @property
    def is_admin(self) -> bool:
        return ADMIN in self.capabilities

    def may_report_for(self, machine_id: str) -> bool:
        return any(fnmatch.fnmatchcase(machine_id, glob) for glob in self.machine_globs)

    def describe(self) -> str:
        parts = []
        if self.user:
            parts.append(f"user {self.user!r}")
        if self.service:
            parts.append(f"service {self.service!r}")
        return " via ".join(parts) or "anonymous"


current_principal: ContextVar[Principal | None] = ContextVar("cellpilot_principal", default=None)


class NoPrincipalError(RuntimeError):
    """A servicer asked for the caller outside an authenticated call."""


def require_principal() -> Principal:
    """The caller of the RPC being served; raises if no security interceptor ran."""
    principal = current_principal.get()
    if principal is None:
        raise NoPrincipalError("no authenticated principal: is the security interceptor installed?")
    return principal
