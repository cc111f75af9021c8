"""The checkpoint store (Borg §3.1) on PostgreSQL: leadership epochs fence the log, so a deposed
master can never append; positions are written once; snapshots are found by position."""

from __future__ import annotations

import asyncio

import pytest

from cellpilot.borg.cell_state import CellState
from cellpilot.borg.mutations import JobKilled, LogRecord, to_records
from cellpilot.checkpoint_store import FencedOut, PostgresCheckpointStore

LEASE_S = 1.0


def _records(first: int, epoch: int, *jobs: str) -> list[LogRecord]:
    return to_records(first, epoch, 1_000, [JobKilled(job) for job in jobs], cause_id="test")


async def test_only_one_replica_leads_and_a_deposed_leader_cannot_append(fresh_database_url: str) -> None:
    store = PostgresCheckpointStore.connect(fresh_database_url)
    try:
        a = store.lease("replica-a", "a:1", LEASE_S)
        b = store.lease("replica-b", "b:1", LEASE_S)

        lead_a = await a.try_acquire()
        assert lead_a is not None
        assert await b.try_acquire() is None, "a live lease must not be taken over"
        assert await store.append(lead_a.token, _records(1, lead_a.token, "one", "two")) == 2

        await asyncio.sleep(LEASE_S + 0.3)  # replica A stalls and does not renew
        lead_b = await b.try_acquire()
        assert lead_b is not None
        assert lead_b.token == lead_a.token + 1
        current = await b.current()
        assert current is not None
        assert (current.holder, current.address) == ("replica-b", "b:1")

        with pytest.raises(FencedOut, match="current epoch"):
            await store.append(lead_a.token, _records(3, lead_a.token, "from the deposed master"))
        assert not await a.renew(), "the deposed master learns it lost the lease"

        assert await store.append(lead_b.token, _records(3, lead_b.token, "three")) == 3
        with pytest.raises(FencedOut, match="already taken"):
            await store.append(lead_b.token, _records(3, lead_b.token, "duplicate position"))
        records = await store.read(after_seq=0)
        assert [(r.sequence, r.epoch, r.mutation) for r in records] == [
            (1, lead_a.token, JobKilled("one")),
            (2, lead_a.token, JobKilled("two")),
            (3, lead_b.token, JobKilled("three")),
        ]
        assert [r.sequence for r in await store.read(after_seq=1, up_to_seq=2)] == [2]
        assert await store.last_sequence() == 3
    finally:
        await store.close()


def _state_at(seq: int) -> CellState:
    state = CellState()
    state.last_sequence = seq
    state.event_time_ms = seq * 1_000
    return state


async def test_release_hands_over_at_once_and_snapshots_are_found_by_position(
    fresh_database_url: str,
) -> None:
    store = PostgresCheckpointStore.connect(fresh_database_url)
    try:
        a = store.lease("replica-a", "a:1", 30.0)
        b = store.lease("replica-b", "b:1", 30.0)
        lead_a = await a.try_acquire()
        assert lead_a is not None
        assert await a.renew()
        await a.release()
        assert await b.try_acquire() is not None, "a released lease is free without waiting for expiry"

        assert await store.write_snapshot(_state_at(10), 1) == 10
        assert await store.write_snapshot(_state_at(20), 1) == 20
        latest = await store.latest_snapshot()
        assert latest is not None
        assert (latest.sequence, latest.state.event_time_ms) == (20, 20_000)
        earlier = await store.latest_snapshot(at_or_before=15)
        assert earlier is not None
        assert earlier.sequence == 10
        assert earlier.state.last_sequence == 10
        assert await store.latest_snapshot(at_or_before=5) is None
    finally:
        await store.close()
