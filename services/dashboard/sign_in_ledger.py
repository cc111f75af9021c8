"""Where the dashboard records used sign-in links and ended sessions: Redis, with expiries.

A one-time link must stay used across dashboard restarts and on every replica until it
expires, so its nonce is recorded outside the process: ``SET key NX PX`` records it and says
in one atomic step whether it was already there, and Redis forgets it once the link could no
longer be used anyway (its expiry plus a clock-skew margin). Signed-out sessions are recorded
the same way until the cookie would have expired.
"""

from __future__ import annotations

import time

from redis.exceptions import RedisError

from cellpilot.platform.redis_client import connect_redis

KEY_PREFIX = "dashboard:"
CLOCK_SKEW_S = 120  # kept this much longer than the expiry, for replicas whose clocks differ


class LedgerUnavailableError(Exception):
    """Redis did not answer: a use could not be recorded or checked."""


class SignInLedger:
    def __init__(self, redis_url: str) -> None:
        self.redis = connect_redis(redis_url)

    async def close(self) -> None:
        await self.redis.aclose()

    @staticmethod
    def _ttl_ms(expires_at: int) -> int:
        return max(1, int((expires_at + CLOCK_SKEW_S - time.time()) * 1000))

    async def spend_ticket(self, nonce: str, expires_at: int) -> bool:
        """Record the link's use; False if it was used before."""
        try:
            first = await self.redis.set(
                f"{KEY_PREFIX}sign-in-link:{nonce}", b"used", nx=True, px=self._ttl_ms(expires_at)
            )
        except RedisError as error:
            raise LedgerUnavailableError(str(error)) from error
        return bool(first)

    async def ticket_spent(self, nonce: str) -> bool:
        try:
            return bool(await self.redis.exists(f"{KEY_PREFIX}sign-in-link:{nonce}"))
        except RedisError as error:
            raise LedgerUnavailableError(str(error)) from error

    async def end_session(self, session_id: str, expires_at: int) -> None:
        try:
            await self.redis.set(f"{KEY_PREFIX}ended-session:{session_id}", b"1", px=self._ttl_ms(expires_at))
        except RedisError as error:
            raise LedgerUnavailableError(str(error)) from error

    async def session_ended(self, session_id: str) -> bool:
        try:
            return bool(await self.redis.exists(f"{KEY_PREFIX}ended-session:{session_id}"))
        except RedisError as error:
            raise LedgerUnavailableError(str(error)) from error
