"""Where the Autopilot master's lease lives: a Redis key with a TTL, and a fencing counter.

Acquiring the lease atomically INCRs the counter and stores ``<token>|<replica>|<address>``
under the lock key with a TTL, so every term has a strictly larger token (docs/architecture.md
rule 7). Every actuation carries the token, and the actuator and the Borgmaster refuse tokens
older than the highest they have seen; the master's own Redis writes are conditional on the
lock key still holding its term (see :mod:`state_store`). The term, renewal and local deadline
are :class:`cellpilot.platform.leadership.LeaderLease`'s.

**A token is durable before it is used.** The lease is Chubby-like (Borg §3.1 elects its master
through Chubby and Paxos; Autopilot §3.1 runs one elected master among replicas), so what keeps
a deposed master harmless is that tokens only grow. Redis replicates asynchronously: a master
that dies right after the INCR may not have passed it on, and the replica Sentinel promotes
would issue the same token again. So with ``min_replicas`` > 0 the acquisition ends with Redis
``WAIT min_replicas timeout`` on the same connection: the term is taken only once the INCR (and
the lock key) reached that many replicas; otherwise the lease is released and the election
tries again later. A token whose WAIT fell short is never used, so the tokens that are used
never repeat nor go backwards across a failover, provided the replica Sentinel promotes is one
of those that acknowledged (with one replica, ``min_replicas`` = 1 is that).
"""

from __future__ import annotations

import redis.asyncio as aioredis

from cellpilot.platform.leadership import LeaderLease, Leadership

_ACQUIRE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], token .. '|' .. ARGV[1], 'PX', ARGV[2])
return token
"""
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def _ttl_ms(lease_s: float) -> int:
    return max(1, int(lease_s * 1000))


class RedisLeaseStore:
    """The lease as the key ``<prefix>:leader`` (expiring), tokens from ``<prefix>:fencing``."""

    def __init__(
        self, redis: aioredis.Redis, prefix: str, min_replicas: int = 0, replica_timeout_s: float = 1.0
    ) -> None:
        self.redis = redis
        self.lock_key = f"{prefix}:leader"
        self.token_key = f"{prefix}:fencing"
        self.min_replicas = min_replicas
        self.replica_timeout_s = replica_timeout_s

    async def acquire(self, holder: str, address: str, lease_s: float) -> int | None:
        """The new term's token, once it is on ``min_replicas`` replicas; None if the lease is
        held, or if too few replicas acknowledged in time (the lease is then given back)."""
        # WAIT counts the replicas that have this connection's writes: one connection for both.
        async with self.redis.client() as connection:
            token = await connection.eval(  # type: ignore[misc]
                _ACQUIRE, 2, self.lock_key, self.token_key, f"{holder}|{address}", _ttl_ms(lease_s)
            )
            if not token:
                return None
            if self.min_replicas <= 0:
                return int(token)
            acknowledged = await connection.wait(self.min_replicas, _ttl_ms(self.replica_timeout_s))
            if int(acknowledged) >= self.min_replicas:
                return int(token)
            term = Leadership(int(token), holder, address)
            await connection.eval(_RELEASE, 1, self.lock_key, term.encode())  # type: ignore[misc]
            return None

    async def renew(self, term: Leadership, lease_s: float) -> bool:
        renewed = await self.redis.eval(  # type: ignore[misc]
            _RENEW, 1, self.lock_key, term.encode(), _ttl_ms(lease_s)
        )
        return bool(renewed)

    async def release(self, term: Leadership) -> None:
        await self.redis.eval(_RELEASE, 1, self.lock_key, term.encode())  # type: ignore[misc]

    async def current(self) -> Leadership | None:
        raw = await self.redis.get(self.lock_key)
        return None if raw is None else Leadership.parse(raw)


def leader_lock(store: RedisLeaseStore, replica_id: str, address: str, ttl_s: float) -> LeaderLease:
    """The Autopilot master's lease: it stops acting a margin (at most 0.5 s) before the key expires."""
    return LeaderLease(store, replica_id, address, ttl_s, margin_s=min(0.5, ttl_s / 4))
