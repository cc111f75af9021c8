"""Redis connections (``redis.asyncio`` for services, a blocking PING for health checks), and
writes fenced by a token (docs/architecture.md rule 7).

A service names its Redis with one URL (``CELLPILOT_REDIS_URL``), in either form:

* ``redis://[user:password@]host:port/<db>``: one server (the embedded stack);
* ``redis+sentinel://[user:password@]host:port,host:port,.../<master-name>[/<db>]``: the
  Sentinels that watch a replicated Redis; the client asks them which server is the master
  now (``redis.asyncio.sentinel.Sentinel.master_for``) and asks again after a failover. The
  user and password are the master's ACL user (added by ``PlatformSettings.redis_url_for``
  like any other URL); the Sentinels themselves are asked without credentials (they answer
  only where the master is).

Every service uses :func:`connect_redis` whichever the form, so nothing is specific to one stack.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio as aioredis
import redis.asyncio.sentinel as aiosentinel
import redis.sentinel

# Applies the batch only while KEYS[1] holds ARGV[1] (the writer's fencing token or lease
# value); each op i >= 2 writes KEYS[i] with ARGV[3i-4] (op), ARGV[3i-3] (field), ARGV[3i-2].
_FENCED_WRITE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
for i = 2, #KEYS do
  local op = ARGV[3 * i - 4]
  if op == 'hset' then
    redis.call('HSET', KEYS[i], ARGV[3 * i - 3], ARGV[3 * i - 2])
  elseif op == 'hdel' then
    redis.call('HDEL', KEYS[i], ARGV[3 * i - 3])
  else
    redis.call('SET', KEYS[i], ARGV[3 * i - 2])
  end
end
return 1
"""


SENTINEL_SCHEME = "redis+sentinel"
# No command of the services blocks in Redis: one this slow met a server that is gone.
SOCKET_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class SentinelTarget:
    """A ``redis+sentinel://`` URL: the Sentinels, the master's name, the database, the ACL login."""

    sentinels: tuple[tuple[str, int], ...]
    master_name: str
    db: int = 0
    username: str | None = None
    password: str | None = None

    @classmethod
    def parse(cls, url: str) -> SentinelTarget | None:
        """The target of a ``redis+sentinel://`` URL; None for any other URL."""
        parts = urlsplit(url)
        if parts.scheme != SENTINEL_SCHEME:
            return None
        hosts = parts.netloc.rpartition("@")[2]
        sentinels = []
        for address in hosts.split(","):
            host, _, port = address.strip().rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"{url!r}: each Sentinel is host:port, got {address!r}")
            sentinels.append((host.strip("[]"), int(port)))
        path = [segment for segment in parts.path.split("/") if segment]
        if not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
            raise ValueError(f"{url!r}: the path is /<master-name>[/<db>]")
        return cls(
            tuple(sentinels),
            unquote(path[0]),
            int(path[1]) if len(path) == 2 else 0,
            unquote(parts.username) if parts.username else None,
            unquote(parts.password) if parts.password else None,
        )


def connect_redis(url: str) -> aioredis.Redis:
    """A client of the Redis ``url`` names: one server, or the master the Sentinels point at."""
    target = SentinelTarget.parse(url)
    if target is None:
        return aioredis.Redis.from_url(url, decode_responses=False, health_check_interval=10)
    sentinel = aiosentinel.Sentinel(
        list(target.sentinels), socket_timeout=SOCKET_TIMEOUT_S, socket_connect_timeout=SOCKET_TIMEOUT_S
    )
    # A master that died mid-command never answers (no reset from a vanished host): the command
    # times out, the client asks the Sentinels again and finds the promoted replica.
    return sentinel.master_for(
        target.master_name,
        db=target.db,
        username=target.username,
        password=target.password,
        decode_responses=False,
        health_check_interval=10,
        socket_timeout=SOCKET_TIMEOUT_S,
        socket_connect_timeout=SOCKET_TIMEOUT_S,
    )


def ping_redis(url: str, timeout_s: float = 1.0) -> bool:
    timeouts = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}
    target = SentinelTarget.parse(url)
    if target is None:
        client = redis.Redis.from_url(url, **timeouts)
    else:
        sentinel = redis.sentinel.Sentinel(list(target.sentinels), **timeouts)
        client = sentinel.master_for(
            target.master_name, db=target.db, username=target.username, password=target.password, **timeouts
        )
    try:
        return bool(client.ping())
    finally:
        client.close()


def reply_bytes(value: bytes | str) -> bytes:
    """A Redis reply as bytes (services connect with ``decode_responses=False``; the types say either)."""
    return value if isinstance(value, bytes) else value.encode()


def reply_text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


@dataclass
class FencedWrites:
    """A batch of writes applied together by :func:`write_fenced`, in the order they were added."""

    ops: list[tuple[str, str, str, bytes | str]] = field(default_factory=list)  # key, op, field, value

    def hset(self, key: str, field_name: str, value: bytes | str) -> None:
        self.ops.append((key, "hset", field_name, value))

    def hdel(self, key: str, field_name: str) -> None:
        self.ops.append((key, "hdel", field_name, b""))

    def set(self, key: str, value: bytes | str) -> None:
        self.ops.append((key, "set", "", value))

    def __len__(self) -> int:
        return len(self.ops)


async def write_fenced(
    client: aioredis.Redis, guard_key: str, guard_value: str, writes: FencedWrites, chunk: int | None = None
) -> bool:
    """Apply ``writes`` atomically if ``guard_key`` still holds ``guard_value``; False = fenced out
    (nothing written). With ``chunk``, large batches go in chunks of that many, each fenced and
    atomic on its own (put what must land last, such as consumed offsets, last)."""
    size = chunk or max(1, len(writes.ops))
    for start in range(0, max(1, len(writes.ops)), size):
        ops = writes.ops[start : start + size]
        args: list[str | bytes] = [guard_value]
        for _, op, name, value in ops:
            args.extend((op, name, value))
        keys = [guard_key, *(op[0] for op in ops)]
        if not await client.eval(_FENCED_WRITE, len(keys), *keys, *args):  # type: ignore[misc]
            return False
    return True
