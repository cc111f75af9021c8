"""Leadership epochs fence the checkpoint log: a deposed master can never append."""

from __future__ import annotations

import asyncio

import pytest

from cellpilot.platform.postgres import create_engine
from cellpilot_services.borgmaster.checkpoint_log import CheckpointLog, FencedOut
from cellpilot_services.borgmaster.leader_lease import leader_lease

LEASE_S = 1.0


async def test_only_one_replica_leads_and_a_deposed_leader_cannot_append(fresh_database_url: str) -> None:
    engine = create_engine(fresh_database_url)
    try:
        a = leader_lease(engine, "replica-a", "a:1", LEASE_S)
        b = leader_lease(engine, "replica-b", "b:1", LEASE_S)
        log = CheckpointLog(engine)

        lead_a = await a.try_acquire()
        assert lead_a is not None
        assert await b.try_acquire() is None, "a live lease must not be taken over"
        assert await log.append(lead_a.token, 1, [("test", b"one"), ("test", b"two")]) == 2

        await asyncio.sleep(LEASE_S + 0.3)  # replica A stalls and does not renew
        lead_b = await b.try_acquire()
        assert lead_b is not None
        assert lead_b.token == lead_a.token + 1
        current = await b.current()
        assert current is not None
        assert (current.holder, current.address) == ("replica-b", "b:1")

        with pytest.raises(FencedOut, match="current epoch"):
            await log.append(lead_a.token, 3, [("test", b"from the deposed master")])
        assert not await a.renew(), "the deposed master learns it lost the lease"

        assert await log.append(lead_b.token, 3, [("test", b"three")]) == 3
        with pytest.raises(FencedOut, match="already taken"):
            await log.append(lead_b.token, 3, [("test", b"duplicate position")])
        entries = await log.read(after_seq=0)
        assert [(e.seq, e.epoch, e.record) for e in entries] == [
            (1, lead_a.token, b"one"),
            (2, lead_a.token, b"two"),
            (3, lead_b.token, b"three"),
        ]
        assert [e.seq for e in await log.read(after_seq=1, up_to_seq=2)] == [2]
    finally:
        await engine.dispose()


async def test_release_hands_over_at_once_and_snapshots_are_found_by_position(
    fresh_database_url: str,
) -> None:
    engine = create_engine(fresh_database_url)
    try:
        a = leader_lease(engine, "replica-a", "a:1", 30.0)
        b = leader_lease(engine, "replica-b", "b:1", 30.0)
        lead_a = await a.try_acquire()
        assert lead_a is not None
        assert await a.renew()
        await a.release()
        assert await b.try_acquire() is not None, "a released lease is free without waiting for expiry"

        log = CheckpointLog(engine)
        await log.write_snapshot(10, 1, b"state at 10")
        await log.write_snapshot(20, 1, b"state at 20")
        assert await log.latest_snapshot() == (20, b"state at 20")
        assert await log.latest_snapshot(at_or_before=15) == (10, b"state at 10")
        assert await log.latest_snapshot(at_or_before=5) is None
    finally:
        await engine.dispose()
