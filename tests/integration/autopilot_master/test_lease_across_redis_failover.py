"""The Autopilot lease over a replicated Redis that Sentinel fails over (docs/architecture.md
rule 7): the client follows the promoted master, a new term's token is larger than every
token used before the failover (it was on the replica before it was used: WAIT), a term whose
token no replica acknowledged is not taken (so none is while the promoted master has no
replica), and the deposed term's token is refused."""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.exceptions
from redis_sentinel_group import SentinelGroup, wait_for

from cellpilot.autopilot.actuation_guard import ActuationGuard, Admission
from cellpilot.platform.leadership import LeaderLease, Leadership
from cellpilot.platform.redis_client import FencedWrites, connect_redis, ping_redis, write_fenced
from cellpilot_services.autopilot.leader_lock import RedisLeaseStore, leader_lock

PREFIX = "cellpilot:autopilot:sentinel-test"
LEASE_S = 2.0


@pytest.fixture
async def group(tmp_path: Path) -> AsyncIterator[SentinelGroup]:
    sentinels = SentinelGroup(tmp_path / "redis", tmp_path / "certs")
    sentinels.root.mkdir()
    try:
        await sentinels.start()
        yield sentinels
    finally:
        sentinels.stop()


async def acquired(lease: LeaderLease) -> Leadership | None:
    """A term, once the store answers again and the lease is free (errors while Sentinel
    fails over count as not yet)."""
    try:
        return await lease.try_acquire()
    except (redis.exceptions.RedisError, OSError):
        return None


async def test_fencing_token_grows_across_a_sentinel_failover_and_the_old_token_is_refused(
    group: SentinelGroup,
) -> None:
    autopilot = connect_redis(group.url_for("autopilot"))
    store = RedisLeaseStore(autopilot, PREFIX, min_replicas=1, replica_timeout_s=5.0)
    try:
        # No replica acknowledges (it is stopped): the term is not taken, the lease stays free.
        starved = RedisLeaseStore(autopilot, PREFIX, min_replicas=1, replica_timeout_s=0.2)
        group.replica.process.send_signal(signal.SIGSTOP)
        try:
            assert await leader_lock(starved, "autopilot-0", "a0", LEASE_S).try_acquire() is None
            assert await store.current() is None
        finally:
            group.replica.process.send_signal(signal.SIGCONT)

        first_lease = leader_lock(store, "autopilot-0", "a0", LEASE_S)
        first = await first_lease.try_acquire()
        assert first is not None
        assert await write_fenced(autopilot, store.lock_key, first.encode(), writes_of(PREFIX, "before"))

        async with group.failover_watch() as switched:
            group.kill(group.master)
            promoted_port = await switched(60.0)
        assert promoted_port == group.replica.port
        assert ping_redis(group.url_for("autopilot"), timeout_s=5.0)  # the health check follows too
        counter: list[int] = []

        async def counter_read() -> bool:
            counter.append(int(await autopilot.get(store.token_key) or 0))
            return True

        # The promoted master has the first term's token: it was WAITed onto it before use.
        await wait_for(counter_read, 30, "the fencing counter on the promoted master")
        assert counter[-1] >= first.token

        # The same client, through the Sentinels, now talks to the promoted replica, which has
        # no replica of its own: once the first term expires, no term is taken (no token could
        # be made durable) until the old master is back as its replica.
        async def first_term_expired() -> bool:
            return await store.current() is None

        await wait_for(first_term_expired, 30, "the first term to expire on the promoted master")
        assert await leader_lock(starved, "autopilot-1", "a1", LEASE_S).try_acquire() is None
        assert await store.current() is None
        group.restart(group.master)

        second_lease = leader_lock(store, "autopilot-1", "a1", LEASE_S)
        second: list[Leadership] = []

        async def took_over() -> bool:
            term = await acquired(second_lease)
            if term is not None:
                second.append(term)
            return term is not None

        await wait_for(took_over, 60, "a new Autopilot term on the promoted master")
        assert second[0].token > first.token
        promoted = group.admin_client(group.replica)
        try:
            assert (await promoted.info("replication"))["role"] == "master"
        finally:
            await promoted.aclose()

        # The deposed term can neither renew nor write, and the actuator refuses its token.
        assert not await first_lease.renew()
        assert not await write_fenced(autopilot, store.lock_key, first.encode(), writes_of(PREFIX, "stale"))
        assert await autopilot.get(f"{PREFIX}:state") == b"before"
        guard = ActuationGuard()
        guard.accept_token(second[0].token)
        assert guard.admit("decided-by-the-deposed-master", first.token) is Admission.FENCED
    finally:
        await autopilot.aclose()


def writes_of(prefix: str, value: str) -> FencedWrites:
    writes = FencedWrites()
    writes.set(f"{prefix}:state", value)
    return writes
