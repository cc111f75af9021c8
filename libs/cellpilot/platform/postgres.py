"""PostgreSQL through SQLAlchemy 2 (async, asyncpg driver), and the migration runner.

A URL names one server (``postgresql+asyncpg://host:port/db``, the embedded stack) or every
member of a replicated cluster, as SQLAlchemy's asyncpg dialect spells several hosts:
``postgresql+asyncpg:///db?host=pg-0:5432&host=pg-1:5432&target_session_attrs=read-write``
(compose: Patroni's members). asyncpg tries the hosts in turn and keeps the first that accepts
writes, so after a failover a new connection finds the promoted primary by itself. A connection
to a primary that failed or was cut off errs instead of hanging (a primary cut off the network
never resets its clients' connections): the kernel gives up on data the server has not
acknowledged within :data:`UNACKNOWLEDGED_SEND_TIMEOUT_S` (``TCP_USER_TIMEOUT``, Linux), and no
statement runs longer than :data:`STATEMENT_TIMEOUT_S`; the pool's pre-ping then drops it (a
:class:`~cellpilot.platform.store_outage.StoreUnavailable` for the caller, who retries).

Migrations are the numbered ``*.sql`` files of ``infra/migrations``; each is applied once,
in name order, inside a transaction, and recorded in ``schema_migrations``. A PostgreSQL
advisory lock serialises replicas that start at the same time.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import asyncpg
from sqlalchemy import Row, event, make_url, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

REPO_ROOT = Path(__file__).resolve().parents[3]
MIGRATIONS_DIR = REPO_ROOT / "infra" / "migrations"
_MIGRATION_LOCK_KEY = 0x43656C6C  # any constant shared by every migrator


# A new connection gives up on an unreachable host after this long (then tries the next one).
CONNECT_TIMEOUT_S = 5.0
# A server that has not acknowledged (at the TCP level) what was sent to it this long is gone,
# however long its statement may run.
UNACKNOWLEDGED_SEND_TIMEOUT_S = 6.0
# No statement of the services runs this long; one that does met a store that stopped answering
# while its host still acknowledges (a primary waiting for a synchronous standby that is gone).
STATEMENT_TIMEOUT_S = 30.0


def fail_unacknowledged_sends(connection: asyncpg.Connection) -> None:
    """Make ``connection``'s socket give up on data unacknowledged for
    :data:`UNACKNOWLEDGED_SEND_TIMEOUT_S` (where the platform has ``TCP_USER_TIMEOUT``)."""
    option = getattr(socket, "TCP_USER_TIMEOUT", None)
    transport = getattr(connection, "_transport", None)
    sock = transport.get_extra_info("socket") if transport is not None else None
    if option is None or sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    sock.setsockopt(socket.IPPROTO_TCP, option, int(UNACKNOWLEDGED_SEND_TIMEOUT_S * 1000))


async def init_asyncpg_connection(connection: asyncpg.Connection) -> None:
    """``init`` for an asyncpg pool: :func:`fail_unacknowledged_sends`."""
    fail_unacknowledged_sends(connection)


def asyncpg_dsn(url: str) -> str:
    """A SQLAlchemy URL (``postgresql+asyncpg://...``) as a plain libpq DSN for asyncpg; the
    hosts of a multi-host URL (``?host=a:5432&host=b:5432``) become asyncpg's ``a:5432,b:5432``
    (one ``?host=``, e.g. the embedded stack's socket directory, is left as it is)."""
    parsed = make_url(url)
    hosts = parsed.query.get("host")
    hosts = (hosts,) if isinstance(hosts, str) else tuple(hosts or ())
    if len(hosts) <= 1:  # one host (a Unix socket directory too): asyncpg reads ?host= itself
        return parsed.set(drivername="postgresql").render_as_string(hide_password=False)
    rest = {key: value for key, value in parsed.query.items() if key != "host"}
    login = ""
    if parsed.username:
        login = quote(parsed.username, safe="")
        if parsed.password:
            login += ":" + quote(str(parsed.password), safe="")
        login += "@"
    query_text = urlencode(rest, doseq=True)
    return f"postgresql://{login}{','.join(hosts)}/{parsed.database or ''}" + (
        f"?{query_text}" if query_text else ""
    )


def create_engine(url: str, pool_size: int = 5) -> AsyncEngine:
    engine = create_async_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=True,
        connect_args={"timeout": CONNECT_TIMEOUT_S, "command_timeout": STATEMENT_TIMEOUT_S},
    )

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        fail_unacknowledged_sends(dbapi_connection.driver_connection)

    return engine


async def query(
    engine: AsyncEngine, sql: str, params: Mapping[str, Any], write: bool = False
) -> Sequence[Row[Any]]:
    """The rows of one statement that returns rows (``RETURNING`` for a write); with ``write``,
    in a transaction of its own (committed)."""
    async with engine.begin() if write else engine.connect() as conn:
        return (await conn.execute(text(sql), dict(params))).all()


async def query_one(
    engine: AsyncEngine, sql: str, params: Mapping[str, Any], write: bool = False
) -> Row[Any] | None:
    """The first row of one statement (None if it returns none), as :func:`query`."""
    rows = await query(engine, sql, params, write)
    return rows[0] if rows else None


async def ensure_database(url: str) -> None:
    """Create the URL's database if it does not exist (connecting to ``postgres`` to do so)."""
    target = make_url(url)
    admin = create_async_engine(target.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        async with admin.connect() as conn:
            exists = await conn.scalar(
                text("SELECT 1 FROM pg_database WHERE datname = :name"), {"name": target.database}
            )
            if not exists:
                await conn.execute(text(f'CREATE DATABASE "{target.database}"'))
    finally:
        await admin.dispose()


async def drop_database(url: str) -> None:
    """Drop the URL's database, disconnecting whoever still uses it."""
    target = make_url(url)
    admin = create_async_engine(target.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        async with admin.connect() as conn:
            await conn.execute(text(f'DROP DATABASE IF EXISTS "{target.database}" WITH (FORCE)'))
    finally:
        await admin.dispose()


def migration_files(directory: Path = MIGRATIONS_DIR) -> list[Path]:
    return sorted(directory.glob("*.sql"))


async def _applied_versions(conn: AsyncConnection) -> set[str] | None:
    """The recorded migrations, or None before the first one (no ``schema_migrations`` yet)."""
    if await conn.scalar(text("SELECT to_regclass('schema_migrations')")) is None:
        return None
    return set((await conn.scalars(text("SELECT version FROM schema_migrations"))).all())


async def apply_migrations(url: str, directory: Path = MIGRATIONS_DIR) -> list[str]:
    """Apply pending migrations; returns the names applied by this call.

    A database with nothing pending is only read, so a service's role (which may create
    nothing: 0013_service_roles.sql) starts on a migrated database; with migrations pending
    it fails with PostgreSQL's "permission denied", and the administrator applies them
    (``cellpilot stack up``, compose's ``postgres-setup``)."""
    engine = create_async_engine(url)
    applied_now: list[str] = []
    try:
        async with engine.connect() as conn:
            done = await _applied_versions(conn)
        if done is not None and {p.name for p in migration_files(directory)} <= done:
            return []
        async with engine.begin() as conn:
            await conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK_KEY})
            await conn.execute(
                text(
                    "CREATE TABLE IF NOT EXISTS schema_migrations ("
                    " version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
                )
            )
            done = set((await conn.scalars(text("SELECT version FROM schema_migrations"))).all())
            for path in migration_files(directory):
                if path.name in done:
                    continue
                # asyncpg runs a multi-statement script only through its simple-query path.
                raw = await conn.get_raw_connection()
                await raw.driver_connection.execute(path.read_text())  # type: ignore[union-attr]
                await conn.execute(
                    text("INSERT INTO schema_migrations (version) VALUES (:v)"), {"v": path.name}
                )
                applied_now.append(path.name)
    finally:
        await engine.dispose()
    return applied_now
