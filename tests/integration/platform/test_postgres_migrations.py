"""PostgreSQL through SQLAlchemy 2 (async) with the project's migrations applied."""

from __future__ import annotations

import socket

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from cellpilot.platform.postgres import (
    UNACKNOWLEDGED_SEND_TIMEOUT_S,
    apply_migrations,
    create_engine,
    migration_files,
)
from cellpilot.platform.settings import PlatformSettings
from cellpilot.stack import Stack, StackEndpoints


async def test_every_migration_is_recorded_and_reapplying_is_a_no_op(endpoints: StackEndpoints) -> None:
    engine = create_engine(endpoints.postgres_url)
    try:
        async with engine.connect() as conn:
            versions = (await conn.scalars(text("SELECT version FROM schema_migrations ORDER BY 1"))).all()
        assert versions == [path.name for path in migration_files()]
        assert await apply_migrations(endpoints.postgres_url) == []
    finally:
        await engine.dispose()


async def test_checkpoint_log_rows_round_trip_and_seq_is_unique(endpoints: StackEndpoints) -> None:
    engine = create_engine(endpoints.postgres_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(text("DELETE FROM checkpoint_log WHERE seq >= 1000000"))
            await conn.execute(
                text("INSERT INTO checkpoint_log (seq, epoch, kind, record) VALUES (1000000, 7, 'test', :r)"),
                {"r": b"\x01\x02"},
            )
        async with engine.connect() as conn:
            row = (
                await conn.execute(text("SELECT epoch, kind, record FROM checkpoint_log WHERE seq = 1000000"))
            ).one()
        assert (row.epoch, row.kind, bytes(row.record)) == (7, "test", b"\x01\x02")
        with pytest.raises(IntegrityError, match="duplicate key"):
            async with engine.begin() as conn:
                await conn.execute(
                    text("INSERT INTO checkpoint_log (seq, epoch, kind, record) VALUES (1000000, 8, 'x', '')")
                )
    finally:
        async with engine.begin() as conn:
            await conn.execute(text("DELETE FROM checkpoint_log WHERE seq >= 1000000"))
        await engine.dispose()


async def test_engine_connections_give_up_on_unacknowledged_sends(embedded_stack: Stack) -> None:
    """A primary cut off the network never resets its clients' connections: each connection's
    socket carries TCP_USER_TIMEOUT, so a send it never acknowledges fails instead of hanging.
    As a service connects: over TCP, as its own role."""
    settings = PlatformSettings(
        postgres_url=embedded_stack.endpoints.postgres_url, certs_dir=embedded_stack.config.certs_dir
    )
    engine = create_engine(settings.postgres_url_for("borgmaster"))
    try:
        async with engine.connect() as conn:
            raw = await conn.get_raw_connection()
            sock = raw.driver_connection._transport.get_extra_info("socket")  # type: ignore[union-attr]
            assert sock.family in (socket.AF_INET, socket.AF_INET6)
            value = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT)
        assert value == int(UNACKNOWLEDGED_SEND_TIMEOUT_S * 1000)
    finally:
        await engine.dispose()
