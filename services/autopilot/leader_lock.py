"""Where the Autopilot master's lease lives: a Redis key with a TTL, and a fencing counter.

Acquiring the lease atomically INCRs the counter and stores ``<token>|<replica>|<address>``
under the lock key with a TTL, so every term has a strictly larger token (docs/architecture.md
rule 7). Every actuation carries the token, and the actuator and the Borgmaster refuse tokens
older than the highest they have seen; the master's own Redis writes are conditional on the
lock key still holding its term (see :mod:`state_store`). The term, renewal and local deadline
are :class:`cellpilot.platform.leadership.LeaderLease`'s.
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

    def __init__(self, redis: aioredis.Redis, prefix: str) -> None:
        self.redis = redis
        self.lock_key = f"{prefix}:leader"
        self.token_key = f"{prefix}:fencing"

    async def acquire(self, holder: str, address: str, lease_s: float) -> int | None:
        token = await self.redis.eval(  # type: ignore[misc]
            _ACQUIRE, 2, self.lock_key, self.token_key, f"{holder}|{address}", _ttl_ms(lease_s)
        )
        return int(token) if token else None

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
