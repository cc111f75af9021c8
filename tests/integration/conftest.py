"""The integration suite runs against one real embedded stack, started and stopped here.

The stack lives in a temporary data directory with ports picked free, so it never
collides with a stack a developer started with ``make run``.

Like ``cellpilot run``, the stack issues its CA, service certificates and token secret, and
every service the tests start (in-process or as a subprocess) reads ``CELLPILOT_CERTS_DIR``
from the environment this fixture exports: the suite runs with mTLS and bearer tokens, as a
real cell does. Test Borglets present ``borglet-test``, a Borglet identity allowed to report
for any machine (the tests name machines freely); tests/integration/security checks the
own-machines rule with the stack's real ``borglet-r0`` identity.

The suite's stacks (this one, and those ``cellpilot run`` makes in the supervision, CLI and chaos
tests) run the in-memory broker unless ``CELLPILOT_STACK_BROKER`` says otherwise: their tests
reach the broker anonymously with a bootstrap address. The durable broker (its log across a
restart, its SCRAM users) has tests of its own in tests/integration/broker.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import make_url

from cellpilot.platform.postgres import apply_migrations, drop_database, ensure_database
from cellpilot.security.certificates import IdentityRequest, issue_all
from cellpilot.stack import Stack, StackConfig, StackEndpoints
from cellpilot.stack.config import BROKER_ENV

os.environ.setdefault(BROKER_ENV, "memory")  # inherited by every `cellpilot run` a test starts

TEST_BORGLET_IDENTITY = "borglet-test"


@pytest.fixture(scope="session")
def embedded_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    stack = Stack(StackConfig(tmp_path_factory.mktemp("stack")))
    stack.up()
    certs_dir = stack.config.certs_dir
    if not (certs_dir / f"{TEST_BORGLET_IDENTITY}.crt").exists():
        issue_all(certs_dir, [IdentityRequest(TEST_BORGLET_IDENTITY, ("*",))], valid_days=2)
    exported = {
        "CELLPILOT_CERTS_DIR": str(certs_dir),
        "CELLPILOT_TLS_MODE": "mtls",
        "CELLPILOT_BORGLET_IDENTITY": TEST_BORGLET_IDENTITY,
    }
    with pytest.MonkeyPatch.context() as patch:
        for key, value in exported.items():
            patch.setenv(key, value)
        try:
            yield stack
        finally:
            stack.down()


@pytest.fixture(scope="session")
def outage_stack() -> Iterator[Stack]:
    """A second stack, only for the store-outage tests (tests/integration/store_outages.py): they
    stop its PostgreSQL or Redis under running services, which the shared stack must never see.

    It lives outside pytest's temporary root: PostgreSQL, restarted mid-test as its own system
    user, must traverse to its data directory, and any pytest starting meanwhile makes that
    root private again.
    """
    data_dir = Path(tempfile.mkdtemp(prefix="cellpilot-outage-stack-"))
    stack = Stack(StackConfig(data_dir))
    try:
        stack.up()
        yield stack
    finally:
        stack.down()
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def endpoints(embedded_stack: Stack) -> StackEndpoints:
    """The administrator's connections (the PostgreSQL superuser over the stack's socket, Redis
    as ``admin``): tests make databases and key prefixes of their own, and a service given a URL
    that names a user uses it as given. What services of a real stack get (their own accounts,
    from ``stack.env`` and their password files) is tested in tests/integration/security."""
    return embedded_stack.admin_endpoints


@pytest.fixture
def fresh_database_url(endpoints: StackEndpoints) -> Iterator[str]:
    """A new, migrated database on the stack's PostgreSQL, dropped after the test."""
    name = f"test_{uuid.uuid4().hex[:12]}"
    url = str(make_url(endpoints.postgres_url).set(database=name))
    asyncio.run(ensure_database(url))
    asyncio.run(apply_migrations(url))
    yield url
    asyncio.run(drop_database(url))
