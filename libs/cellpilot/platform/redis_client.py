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
