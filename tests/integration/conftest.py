"""The integration suite runs against one real embedded stack, started and stopped here.

The stack lives in a temporary data directory with ports picked free, so it never
collides with a stack a developer started with ``make run``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import make_url

from cellpilot.platform.postgres import apply_migrations, drop_database, ensure_database
from cellpilot.stack import Stack, StackConfig, StackEndpoints


@pytest.fixture(scope="session")
def embedded_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    stack = Stack(StackConfig(tmp_path_factory.mktemp("stack")))
    stack.up()
    try:
        yield stack
    finally:
        stack.down()


@pytest.fixture(scope="session")
def endpoints(embedded_stack: Stack) -> StackEndpoints:
    return embedded_stack.endpoints


@pytest.fixture
def fresh_database_url(endpoints: StackEndpoints) -> Iterator[str]:
    """A new, migrated database on the stack's PostgreSQL, dropped after the test."""
    name = f"test_{uuid.uuid4().hex[:12]}"
    url = str(make_url(endpoints.postgres_url).set(database=name))
    asyncio.run(ensure_database(url))
    asyncio.run(apply_migrations(url))
    yield url
    asyncio.run(drop_database(url))
