"""Redis round trip through the service helper, against the embedded redis-server."""

from __future__ import annotations

import uuid

from cellpilot.platform.redis_client import connect_redis
from cellpilot.stack import StackEndpoints


async def test_value_written_is_read_back(endpoints: StackEndpoints) -> None:
    client = connect_redis(endpoints.redis_url)
    key = f"test:{uuid.uuid4()}"
    try:
        assert await client.set(key, b"\x00payload", nx=True)
        assert await client.get(key) == b"\x00payload"
        assert not await client.set(key, b"other", nx=True), "NX must refuse an existing key"
        assert await client.delete(key) == 1
        assert await client.get(key) is None
    finally:
        await client.aclose()
