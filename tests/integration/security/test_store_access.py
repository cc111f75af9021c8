"""Least privilege in the stores, against the real embedded PostgreSQL and Redis.

A connection without its credential is refused (no password, a wrong one, the PostgreSQL
superuser over TCP, Redis's ``default`` user), and each service's account can do its own work
and nothing else: table-driven per PostgreSQL role (e.g. only the Borgmaster appends to the
checkpoint log, and even it cannot rewrite it) and per Redis user (its own key prefix, no
dangerous commands). Every table of the schema is granted to some role, so a migration that
adds a table without a grant fails here rather than in a running cell.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import asyncpg
import pytest
import redis
from sqlalchemy import make_url

from cellpilot.platform.store_accounts import (
    POSTGRES_ACCOUNTS,
    postgres_role,
    service_postgres_url,
    service_redis_url,
)
from cellpilot.security.store_secrets import read_store_password
from cellpilot.stack import Stack

pytestmark = pytest.mark.timeout(60)

DENIED, ALLOWED = False, True
LOG_ROW = "INSERT INTO checkpoint_log (seq, epoch, kind, record) VALUES (1, 1, 'test', '\\x00')"
SNAPSHOT_ROW = (
    "INSERT INTO checkpoint_snapshot (seq, epoch, format, state)"
    " VALUES (1, 1, 'cellpilot.api.v1.CellSnapshot', '\\x00')"
)


def _dsn(url: str) -> str:
    """A SQLAlchemy URL as the libpq DSN asyncpg takes."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _service_database_url(stack: Stack, database: str, account: str) -> str:
    url = str(make_url(stack.endpoints.postgres_url).set(database=database))
    return _dsn(service_postgres_url(url, account, stack.config.certs_dir))


REFUSED = (asyncpg.InvalidPasswordError, asyncpg.InvalidAuthorizationSpecificationError)


async def _refused(dsn: str, **kwargs: str) -> BaseException:
    try:
        connection = await asyncpg.connect(dsn, timeout=10, **kwargs)
    except REFUSED as error:
        return error
    await connection.close()
    raise AssertionError(f"PostgreSQL let {kwargs.get('user')!r} in")


async def test_postgres_refuses_connections_without_their_credential(embedded_stack: Stack) -> None:
    tcp = _dsn(embedded_stack.endpoints.postgres_url)
    role = postgres_role("borgmaster")
    await _refused(tcp, user=role)  # no password
    await _refused(tcp, user=role, password="not-the-password")
    # The superuser never over TCP, whatever it says; and the dashboard has no role at all.
    assert "pg_hba.conf rejects" in str(await _refused(tcp, user="postgres", password="postgres"))
    dashboard = read_store_password(embedded_stack.config.certs_dir, "dashboard")
    await _refused(tcp, user=postgres_role("dashboard"), password=dashboard)
    # With its own password, a service's role gets in.
    connection = await asyncpg.connect(_service_database_url(embedded_stack, "cellpilot", "borgmaster"))
    try:
        assert await connection.fetchval("SELECT current_user") == role
    finally:
        await connection.close()


ROLE_CASES = [
    ("borgmaster", LOG_ROW, ALLOWED),
    ("borgmaster", "SELECT count(*) FROM checkpoint_snapshot", ALLOWED),
    ("borgmaster", SNAPSHOT_ROW, ALLOWED),
    ("borgmaster", "UPDATE checkpoint_snapshot SET format = 'rewritten'", DENIED),
    ("borgmaster", "UPDATE checkpoint_log SET kind = 'rewritten'", DENIED),
    ("borgmaster", "DELETE FROM checkpoint_log", DENIED),
    ("borgmaster", "DROP TABLE checkpoint_log", DENIED),
    ("borgmaster", "CREATE TABLE intruder (v int)", DENIED),
    ("borgmaster", "SELECT count(*) FROM usage_task_windows", DENIED),
    ("aggregator", "INSERT INTO aggregator_progress (name) VALUES ('test')", ALLOWED),
    ("aggregator", "SELECT count(*) FROM usage_job_histograms", ALLOWED),
    ("aggregator", "SELECT count(*) FROM checkpoint_log", DENIED),
    ("aggregator", LOG_ROW, DENIED),
    ("aggregator", "DELETE FROM usage_task_windows", DENIED),
    ("fauxmaster", "SELECT count(*) FROM checkpoint_log", ALLOWED),
    ("fauxmaster", "SELECT seq, format, state FROM checkpoint_snapshot", ALLOWED),
    ("fauxmaster", LOG_ROW, DENIED),
    ("fauxmaster", "UPDATE leader_lease SET epoch = epoch + 1", DENIED),
    ("scheduler", "SELECT seq, format, state FROM checkpoint_snapshot", ALLOWED),
    ("scheduler", LOG_ROW, DENIED),
    ("scheduler", "UPDATE leader_lease SET epoch = epoch + 1", DENIED),
]


@pytest.mark.parametrize(("account", "statement", "allowed"), ROLE_CASES)
async def test_each_postgres_role_may_do_its_own_work_and_nothing_else(
    embedded_stack: Stack, fresh_database_url: str, account: str, statement: str, allowed: bool
) -> None:
    database = make_url(fresh_database_url).database
    assert database is not None
    connection = await asyncpg.connect(_service_database_url(embedded_stack, database, account))
    try:
        if allowed:
            await connection.execute(statement)
        else:
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await connection.execute(statement)
    finally:
        await connection.close()


async def test_every_table_is_granted_to_a_service_role(fresh_database_url: str) -> None:
    connection = await asyncpg.connect(_dsn(fresh_database_url))
    try:
        ungranted = await connection.fetch(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'public' AND c.relkind = 'r' AND NOT EXISTS (SELECT 1"
            " FROM unnest($1::text[]) AS r(name) WHERE has_table_privilege(r.name, c.oid, 'SELECT'))",
            [postgres_role(account) for account in POSTGRES_ACCOUNTS],
        )
    finally:
        await connection.close()
    assert [row["relname"] for row in ungranted] == []


@pytest.fixture
def redis_as(embedded_stack: Stack) -> Iterator[dict[str, redis.Redis]]:
    """A Redis client per service account, as a real stack's services connect."""
    url, certs = embedded_stack.endpoints.redis_url, embedded_stack.config.certs_dir
    clients = {
        account: redis.Redis.from_url(service_redis_url(url, account, certs), socket_timeout=5)
        for account in ("recommender", "autopilot", "actuator", "dashboard")
    }
    yield clients
    for client in clients.values():
        client.close()


def test_redis_refuses_connections_without_their_credential(embedded_stack: Stack) -> None:
    url = embedded_stack.endpoints.redis_url
    with pytest.raises(redis.AuthenticationError):  # the default user is off: NOAUTH
        redis.Redis.from_url(url, socket_timeout=5).ping()
    wrong = url.replace("redis://", "redis://recommender:not-the-password@")
    with pytest.raises(redis.AuthenticationError):
        redis.Redis.from_url(wrong, socket_timeout=5).ping()


def test_each_redis_user_may_touch_only_its_own_keys(redis_as: dict[str, redis.Redis]) -> None:
    suffix = uuid.uuid4().hex[:8]
    recommender, autopilot, dashboard = redis_as["recommender"], redis_as["autopilot"], redis_as["dashboard"]
    assert recommender.set(f"cellpilot:recommender:test-{suffix}", b"1", ex=60)
    # A fenced script on its own keys runs; a script naming another service's key does not.
    script = "return redis.call('SET', KEYS[1], ARGV[1], 'EX', 60)"
    assert autopilot.eval(script, 1, f"cellpilot:autopilot:test-{suffix}", "x")
    refused = [
        lambda: recommender.get("cellpilot:autopilot:leader"),
        lambda: recommender.set(f"elsewhere:{suffix}", b"1"),
        lambda: autopilot.eval(script, 1, f"cellpilot:actuator:test-{suffix}", "x"),
        lambda: dashboard.set("cellpilot:actuator:fencing", b"999"),
        lambda: dashboard.keys("*"),
        lambda: dashboard.flushall(),
        lambda: dashboard.config_get("*"),
    ]
    for action in refused:
        with pytest.raises(redis.exceptions.NoPermissionError):
            action()
