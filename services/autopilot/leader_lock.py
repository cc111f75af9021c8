"""Leadership of the Autopilot master replicas: a Redis lock with a fencing token.

Acquiring the lock atomically INCRs a counter and stores ``<token>|<replica>|<address>``
under the lock key with a TTL, so every term has a strictly larger token (docs/architecture.md rule
7). The leader renews before the TTL runs out; a replica that fails to renew steps down.
Every actuation carries the token, and the actuator and the Borgmaster refuse tokens older
than the highest they have seen; the master's own Redis writes are conditional on the
lock still holding its token (see :mod:`state_store`).

The leader also keeps a local deadline (last successful renewal + TTL - a margin, on the
monotonic clock) and stops acting once it has passed, before Redis would expire the key.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis.asyncio as aioredis

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


@dataclass(frozen=True)
class Leadership:
    token: int
    holder: str
    address: str

    @property
    def value(self) -> str:
        return f"{self.token}|{self.holder}|{self.address}"

    @classmethod
    def parse(cls, raw: bytes | str) -> Leadership:
        text = raw.decode() if isinstance(raw, bytes) else raw
        token, holder, address = text.split("|", 2)
        return cls(int(token), holder, address)


class LeaderLock:
    def __init__(
        self, redis: aioredis.Redis, prefix: str, replica_id: str, address: str, ttl_s: float
    ) -> None:
        self.redis = redis
        self.lock_key = f"{prefix}:leader"
        self.token_key = f"{prefix}:fencing"
        self.replica_id = replica_id
        self.address = address
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self.held: Leadership | None = None
        self._valid_until = 0.0

    @property
    def margin_s(self) -> float:
        return min(0.5, self.ttl_ms / 4000)

    def holds(self) -> bool:
        """Leader now, by our own clock (stops short of the key's expiry in Redis)."""
        return self.held is not None and time.monotonic() < self._valid_until

    async def try_acquire(self) -> Leadership | None:
        started = time.monotonic()
        token = await self.redis.eval(  # type: ignore[misc]
            _ACQUIRE, 2, self.lock_key, self.token_key, f"{self.replica_id}|{self.address}", self.ttl_ms
        )
        if not token:
            return None
        self.held = Leadership(int(token), self.replica_id, self.address)
        self._valid_until = started + self.ttl_ms / 1000 - self.margin_s
        return self.held

    async def renew(self) -> bool:
        if self.held is None:
            return False
        started = time.monotonic()
        renewed = await self.redis.eval(  # type: ignore[misc]
            _RENEW, 1, self.lock_key, self.held.value, self.ttl_ms
        )
        if not renewed:
            self.held = None
            return False
        self._valid_until = started + self.ttl_ms / 1000 - self.margin_s
        return True

    async def release(self) -> None:
        if self.held is not None:
            await self.redis.eval(_RELEASE, 1, self.lock_key, self.held.value)  # type: ignore[misc]
        self.held = None

    def step_down(self) -> None:
        self.held = None

    async def current(self) -> Leadership | None:
        raw = await self.redis.get(self.lock_key)
        return None if raw is None else Leadership.parse(raw)
