"""Store outages for the tests that need one: stop a store of a stack and start it again.

They run on the ``outage_stack`` of conftest.py — a second stack of their own, never the
shared one every other test relies on — so stopping its PostgreSQL or Redis is a real outage:
connections break, new ones are refused, and ``Stack.up`` brings the store back on the same
data directory and port.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid

import pytest
from sqlalchemy import make_url

from cellpilot.platform.postgres import apply_migrations, ensure_database
from cellpilot.stack import Stack
from cellpilot.stack.config import port_in_use


def stop_store(stack: Stack, name: str) -> None:
    """Stop the stack's ``postgres`` or ``redis`` the way its supervisor does, and wait until it is gone."""
    component = next(c for c in stack.components() if c.name == name)
    status = next(s for s in stack.status() if s.name == name)
    assert status.running, f"{name} is not running"
    assert status.pid is not None
    os.kill(status.pid, component.stop_signal)
    deadline = time.monotonic() + 20
    while port_in_use(stack.config.host, component.port) or any(
        s.running for s in stack.status() if s.name == name
    ):
        assert time.monotonic() < deadline, f"{name} did not stop"
        time.sleep(0.05)


async def start_stores(stack: Stack) -> None:
    """Start whatever of the stack is stopped, and wait until it is healthy."""
    await asyncio.to_thread(stack.up)


def use_stack_certificates(monkeypatch: pytest.MonkeyPatch, stack: Stack) -> None:
    """Services and clients of this test use the outage stack's CA, certificates and store passwords."""
    monkeypatch.setenv("CELLPILOT_CERTS_DIR", str(stack.config.certs_dir))
    monkeypatch.setenv("CELLPILOT_TLS_MODE", "mtls")


async def fresh_database(stack: Stack) -> str:
    """A new database on the stack's PostgreSQL (the stack goes away with the session), migrated by
    the administrator; the URL names no user, so each service connects over TCP as its own role,
    as in a real stack (``use_stack_certificates`` points them at the stack's password files)."""
    name = f"outage_{uuid.uuid4().hex[:10]}"
    admin_url = str(make_url(stack.admin_endpoints.postgres_url).set(database=name))
    await ensure_database(admin_url)
    await apply_migrations(admin_url)
    return str(make_url(stack.endpoints.postgres_url).set(database=name))
