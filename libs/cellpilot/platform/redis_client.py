"""Redis connections (``redis.asyncio`` for services, a blocking PING for health checks)."""

from __future__ import annotations

import redis
import redis.asyncio as aioredis


def connect_redis(url: str) -> aioredis.Redis:
    return aioredis.Redis.from_url(url, decode_responses=False, health_check_interval=10)


def ping_redis(url: str, timeout_s: float = 1.0) -> bool:
    client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    try:
        return bool(client.ping())
    finally:
        client.close()


def reply_bytes(value: bytes | str) -> bytes:
    """A Redis reply as bytes (services connect with ``decode_responses=False``; the types say either)."""
    return value if isinstance(value, bytes) else value.encode()


def reply_text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
