"""Credentials for tests that call the stack's services directly (raw stubs, clients, HTTP).

The session fixture in conftest.py exports the stack's ``CELLPILOT_CERTS_DIR``; these helpers
read it, so a test acts as a named user (a bearer token over the ``client`` certificate) or as
a service (its own certificate), exactly like the CLI and the services do.
"""

from __future__ import annotations

import ssl
from typing import Any

import grpc

from cellpilot.security.identity import ADMIN
from cellpilot.security.tls import SecuritySettings

ADMIN_USER = "root"


def security() -> SecuritySettings:
    return SecuritySettings.load()


def user_token(user: str = ADMIN_USER, admin: bool | None = None) -> str:
    """A bearer token for ``user``; ``root`` (the default) holds the admin capability."""
    signer = security().token_signer()
    assert signer is not None, "the stack's token secret is missing"
    is_admin = user == ADMIN_USER if admin is None else admin
    return signer.issue_for(user, capabilities=[ADMIN] if is_admin else [], ttl_s=3600)


def user_credentials(user: str = ADMIN_USER, admin: bool | None = None) -> grpc.ChannelCredentials:
    """The ``client`` certificate plus ``user``'s token on every call of the channel."""
    transport = security().channel_credentials()
    assert transport is not None, "the tests run with mTLS"
    return grpc.composite_channel_credentials(
        transport, grpc.access_token_call_credentials(user_token(user, admin))
    )


def user_channel(address: str, user: str = ADMIN_USER, admin: bool | None = None) -> grpc.aio.Channel:
    """A channel on which every call is made by ``user`` (an admin by default)."""
    return grpc.aio.secure_channel(address, user_credentials(user, admin))


def service_channel(address: str, identity: str) -> grpc.aio.Channel:
    """A channel on which every call is made by the service ``identity`` (its certificate)."""
    credentials = security().channel_credentials(identity)
    assert credentials is not None, "the tests run with mTLS"
    return grpc.aio.secure_channel(address, credentials)


def client_options(user: str = ADMIN_USER, admin: bool | None = None) -> dict[str, Any]:
    """Keyword arguments for CellpilotClient / SyncCellpilotClient acting as ``user``."""
    return {"credentials": security().channel_credentials(), "token": user_token(user, admin)}


def https_context() -> ssl.SSLContext:
    """Verifies HTTPS services (the dashboard) against the stack's CA."""
    return ssl.create_default_context(cafile=str(security().certs_dir / "ca.crt"))


def bearer_header(user: str = ADMIN_USER, admin: bool | None = None) -> dict[str, str]:
    return {"Authorization": f"Bearer {user_token(user, admin)}"}
