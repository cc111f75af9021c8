"""Failovers of the compose stack's replicated stores, under a stream of SubmitJob requests.

One implementation for the container tests (``tests/containers``, which assert on what these
return) and the benchmark (``make bench BENCH=compose.``, which prints it as figures). Each
scenario faults one store with Docker itself (SIGKILL, or ``docker network disconnect``) while
:class:`SubmitStream` keeps submitting one-task jobs through the published Borgmaster ports,
then audits: every acknowledged job is present once, nothing acknowledged is lost.

* :func:`kill_postgres_primary`: the PostgreSQL primary (Patroni's leader) is killed; Patroni
  promotes the synchronous standby; the old primary, started again, rejoins as a standby;
* :func:`partition_postgres_primary`: the primary is cut off the network instead; it must
  demote itself (it cannot reach etcd) before the standby is promoted, so there is never a
  moment with two primaries; reconnected, it rejoins as a standby (pg_rewind);
* :func:`kill_redis_master`: the Redis master is killed; the Sentinels promote a replica; the
  Autopilot master holds its lease again on the new master, and the fencing token never goes
  backwards;
* :func:`kill_master_and_postgres_primary`: the elected Borgmaster and the PostgreSQL primary
  are killed at the same moment.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from cellpilot.api.v1 import borgmaster_pb2, job_pb2, resources_pb2
from cellpilot.client import CellpilotClient
from cellpilot.client.errors import CellpilotError
from cellpilot.platform.redis_keys import AUTOPILOT_PREFIX
from cellpilot.stack.compose_project import ComposeStack, DockerError

POSTGRES_MEMBERS = ("pg-0", "pg-1")
REDIS_NODES = ("redis-0", "redis-1", "redis-2")
SENTINELS = ("sentinel-0", "sentinel-1", "sentinel-2")
SENTINEL_MASTER_NAME = "cellpilot"
AUTOPILOT_LEASE_KEY = f"{AUTOPILOT_PREFIX}:leader"
_PY = "/usr/bin/python3"  # Debian's, in the postgres-ha image


# ---------------------------------------------------------------------- the stores, as Docker sees them


def postgres_cluster(compose: ComposeStack, asked: str | None = None) -> dict[str, str]:
    """Patroni's view of the cluster: {member: role} (``leader``, ``sync_standby``, ``replica``),
    asked of the first member that answers (``asked`` first)."""
    script = (
        "import json, urllib.request as u; "
        "print(json.dumps({m['name']: m['role'] for m in "
        "json.load(u.urlopen('http://127.0.0.1:8008/cluster', timeout=3))['members']}))"
    )
    order = [asked] if asked else []
    order += [m for m in POSTGRES_MEMBERS if m != asked]
    for member in order:
        try:
            return dict(json.loads(compose.exec(member, [_PY, "-c", script], timeout_s=20).strip()))
        except (DockerError, ValueError):
            continue
    return {}


def accepts_writes(compose: ComposeStack, member: str) -> bool | None:
    """Whether ``member``'s PostgreSQL runs as a primary (not in recovery), asked over its own
    socket (so it answers while the member is cut off the network); None if it does not answer."""
    argv = ["psql", "-h", "/var/run/postgresql", "-U", "postgres", "-tAc", "SELECT pg_is_in_recovery()"]
    try:
        out = compose.exec(member, argv, timeout_s=10).strip()
    except DockerError:
        return None
    return {"f": True, "t": False}.get(out)


def postgres_primary(compose: ComposeStack) -> str:
    leaders = [m for m, role in postgres_cluster(compose).items() if role == "leader"]
    if len(leaders) != 1:
        raise DockerError(f"expected one PostgreSQL leader, Patroni reports {leaders or 'none'}")
    return leaders[0]


def redis_master(compose: ComposeStack) -> str:
    """The Redis master the Sentinels name now."""
    argv = ["redis-cli", "-p", "26379", "SENTINEL", "get-master-addr-by-name", SENTINEL_MASTER_NAME]
    for sentinel in SENTINELS:
        try:
            out = compose.exec(sentinel, argv, timeout_s=10).split()
        except DockerError:
            continue
        if out:
            return out[0]
    raise DockerError("no Sentinel names a Redis master")


def redis_admin(compose: ComposeStack, node: str, *command: str) -> str:
    """One command on ``node`` as the Redis admin user (its password from the node's /certs)."""
    quoted = " ".join(f"'{part}'" for part in command)
    script = f'redis-cli --no-auth-warning --user admin --pass "$(cat /certs/admin.password)" {quoted}'
    return compose.exec(node, ["sh", "-c", script], timeout_s=10).strip()


def autopilot_term(compose: ComposeStack) -> tuple[int, float] | None:
    """The Autopilot lease on the current Redis master: (fencing token, milliseconds it has
    left), or None while no master answers or no Autopilot replica holds the lease."""
    try:
        master = redis_master(compose)
        value = redis_admin(compose, master, "GET", AUTOPILOT_LEASE_KEY)
        left_ms = redis_admin(compose, master, "PTTL", AUTOPILOT_LEASE_KEY)
    except DockerError:
        return None
    if not value or not value.split("|", 1)[0].isdigit():
        return None
    return int(value.split("|", 1)[0]), float(left_ms or 0)


# ---------------------------------------------------------------------- the load


async def grant_quota(client: CellpilotClient, user: str) -> None:
    """Room for anything the scenarios submit, in the production and batch bands."""
    for band in (job_pb2.PRIORITY_BAND_PRODUCTION, job_pb2.PRIORITY_BAND_BATCH):
        limit = resources_pb2.Resources(
            cpu_millicores=10_000_000, memory_bytes=1 << 50, disk_bytes=1 << 50, ports=100_000
        )
        await client.borgmaster.set_quota(borgmaster_pb2.SetQuotaRequest(user=user, band=band, limit=limit))


def probe_job(user: str, name: str) -> job_pb2.JobSpec:
    """A one-task production job that uses almost nothing (a simulated steady task)."""
    return job_pb2.JobSpec(
        name=name,
        user=user,
        priority=9,
        app_class=job_pb2.APP_CLASS_LATENCY_SENSITIVE,
        task_count=1,
        task=job_pb2.TaskSpec(
            limits=resources_pb2.Resources(cpu_millicores=10, memory_bytes=16 << 20),
            runtime=job_pb2.RuntimeSpec(simulated=job_pb2.SimulatedRuntime(usage_model="steady")),
        ),
    )


@dataclass
class SubmitStream:
    """SubmitJob requests in a loop (``concurrency`` in flight), each with its send and
    acknowledgement times. A request the client gave up on (its retry budget spent) is
    recorded as failed: it may or may not have been committed, and is never counted lost."""

    client: CellpilotClient
    user: str
    prefix: str
    concurrency: int = 3
    sent: dict[str, float] = field(default_factory=dict)
    acknowledged: dict[str, float] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    _counter: itertools.count[int] = field(default_factory=itertools.count)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _progress: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def _worker(self) -> None:
        while not self._stop.is_set():
            name = f"{self.prefix}-{next(self._counter)}"
            job_id = f"{self.user}/{name}"
            self.sent[job_id] = time.monotonic()
            try:
                await self.client.borgmaster.submit_job(probe_job(self.user, name))
            except CellpilotError as error:
                if error.code == grpc.StatusCode.ALREADY_EXISTS:  # an earlier attempt committed
                    self.acknowledged[job_id] = time.monotonic()
                else:
                    self.failed[job_id] = f"{error.code.name}: {error.details[:120]}"
            else:
                self.acknowledged[job_id] = time.monotonic()
            async with self._progress:
                self._progress.notify_all()
            await asyncio.sleep(0.05)

    async def run(self) -> None:
        await asyncio.gather(*(self._worker() for _ in range(self.concurrency)))

    def stop(self) -> None:
        self._stop.set()

    def acked_after(self, moment: float) -> list[float]:
        """Acknowledgement times of the requests first sent after ``moment``."""
        return sorted(t for job, t in self.acknowledged.items() if self.sent[job] >= moment)

    async def wait(self, done: Callable[[], bool], within_s: float, what: str) -> None:
        async def satisfied() -> None:
            async with self._progress:
                await self._progress.wait_for(done)

        try:
            await asyncio.wait_for(satisfied(), within_s)
        except TimeoutError:
            raise AssertionError(
                f"timed out after {within_s:.0f} s waiting for {what} "
                f"({len(self.acknowledged)} acknowledged, {len(self.failed)} failed: "
                f"{list(self.failed.values())[-3:]})"
            ) from None

    async def audit(self) -> tuple[list[str], list[str]]:
        """(acknowledged jobs missing from the cell, jobs listed more than once)."""
        jobs = await self.client.borgmaster.list_jobs(
            borgmaster_pb2.ListJobsRequest(user=self.user, name_prefix=f"{self.prefix}-", page_size=500)
        )
        seen: dict[str, int] = {}
        for job in jobs:
            seen[job.job_id] = seen.get(job.job_id, 0) + 1
        lost = sorted(job for job in self.acknowledged if job not in seen)
        doubled = sorted(job for job, count in seen.items() if count > 1)
        return lost, doubled


@dataclass
class StoreFailover:
    """What one scenario measured."""

    faulted: str  # the container(s) faulted
    promoted: str  # the member that took over
    write_gap_s: float  # fault -> first acknowledged submit sent after it
    acknowledged: int
    failed: int
    lost: list[str]
    doubled: list[str]
    rejoined_as: str = ""  # the faulted member's role once it is back
    rejoin_s: float = 0.0  # back (started or reconnected) -> rejoined
    two_primaries_s: float = 0.0  # time both PostgreSQL members ran as primaries (sampled)


async def _under_load(
    client: CellpilotClient, user: str, prefix: str, fault: Callable[[], None], settle_acks: int = 10
) -> tuple[SubmitStream, float, asyncio.Task[None]]:
    stream = SubmitStream(client, user, prefix)
    runner = asyncio.create_task(stream.run())
    what = f"{settle_acks} writes before the fault"
    await stream.wait(lambda: len(stream.acknowledged) >= settle_acks, 120, what)
    await asyncio.to_thread(fault)
    # From when the fault is done (the container dead, or off the network): a request sent
    # before it may still have been acknowledged by the old primary.
    faulted_at = time.monotonic()
    return stream, faulted_at, runner


async def _finish(stream: SubmitStream, runner: asyncio.Task[None], after: float, within_s: float) -> float:
    """Wait for writes to resume (and 10 more acknowledgements); the gap; the stream stopped."""
    what = "writes to be acknowledged again"
    await stream.wait(lambda: len(stream.acked_after(after)) >= 10, within_s, what)
    gap = stream.acked_after(after)[0] - after
    stream.stop()
    await runner
    return gap


async def _rejoined(compose: ComposeStack, member: str, within_s: float) -> tuple[str, float]:
    start = time.monotonic()
    while time.monotonic() - start < within_s:
        role = (await asyncio.to_thread(postgres_cluster, compose)).get(member, "")
        standby = role in ("replica", "sync_standby")
        if standby and await asyncio.to_thread(accepts_writes, compose, member) is False:
            return role, time.monotonic() - start
        await asyncio.sleep(1.0)
    raise AssertionError(f"{member} did not rejoin as a standby within {within_s:.0f} s")


async def kill_postgres_primary(compose: ComposeStack, client: CellpilotClient, user: str) -> StoreFailover:
    primary = await asyncio.to_thread(postgres_primary, compose)
    stream, killed_at, runner = await _under_load(client, user, "pgkill", lambda: compose.kill(primary))
    gap = await _finish(stream, runner, killed_at, 120)
    promoted = await asyncio.to_thread(postgres_primary, compose)
    await asyncio.to_thread(compose.start, primary)
    role, rejoin_s = await _rejoined(compose, primary, 180)
    lost, doubled = await stream.audit()
    return StoreFailover(
        primary, promoted, gap, len(stream.acknowledged), len(stream.failed), lost, doubled, role, rejoin_s
    )


async def partition_postgres_primary(
    compose: ComposeStack, client: CellpilotClient, user: str, hold_s: float = 10.0
) -> StoreFailover:
    primary = await asyncio.to_thread(postgres_primary, compose)
    other = next(m for m in POSTGRES_MEMBERS if m != primary)
    stream, cut_at, runner = await _under_load(client, user, "pgcut", lambda: compose.disconnect(primary))
    both = 0.0
    sampled_at = time.monotonic()
    try:
        while not (len(stream.acked_after(cut_at)) >= 10 and time.monotonic() - cut_at >= hold_s):
            if time.monotonic() - cut_at > 150:
                raise AssertionError("writes were not acknowledged again within 150 s of the partition")
            isolated, promoted = await asyncio.gather(
                asyncio.to_thread(accepts_writes, compose, primary),
                asyncio.to_thread(accepts_writes, compose, other),
            )
            now = time.monotonic()
            if isolated and promoted:
                both += now - sampled_at
            sampled_at = now
            await asyncio.sleep(0.5)
    finally:
        await asyncio.to_thread(compose.connect, primary)
    gap = await _finish(stream, runner, cut_at, 60)
    role, rejoin_s = await _rejoined(compose, primary, 180)
    lost, doubled = await stream.audit()
    return StoreFailover(
        primary, other, gap, len(stream.acknowledged), len(stream.failed), lost, doubled, role, rejoin_s, both
    )


async def kill_master_and_postgres_primary(
    compose: ComposeStack, client: CellpilotClient, user: str
) -> StoreFailover:
    primary = await asyncio.to_thread(postgres_primary, compose)
    leader = (await client.borgmaster.get_leader()).leader.replica_id

    def both() -> None:
        compose.kill(leader)
        compose.kill(primary)

    stream, killed_at, runner = await _under_load(client, user, "bothkill", both)
    gap = await _finish(stream, runner, killed_at, 180)
    promoted = await asyncio.to_thread(postgres_primary, compose)
    await asyncio.to_thread(compose.start, primary)
    await asyncio.to_thread(compose.start, leader)
    role, rejoin_s = await _rejoined(compose, primary, 180)
    await asyncio.to_thread(compose.wait_healthy, [leader], 180)
    lost, doubled = await stream.audit()
    faulted = f"{leader}+{primary}"
    acked, failed = len(stream.acknowledged), len(stream.failed)
    return StoreFailover(faulted, promoted, gap, acked, failed, lost, doubled, role, rejoin_s)


@dataclass
class RedisFailover:
    killed: str
    promoted: str
    autopilot_gap_s: float  # kill -> the Autopilot lease held (and renewed) on the new master
    tokens: list[int]  # fencing tokens seen, in order (one entry per change)
    token_decreases: int
    old_master_role: str  # the killed node's role once started again


async def kill_redis_master(compose: ComposeStack, within_s: float = 120.0) -> RedisFailover:
    """Kill the Redis master while the Autopilot masters run; follow the lease until a replica
    holds it on the promoted master (its time left refreshed after the kill)."""
    master = await asyncio.to_thread(redis_master, compose)
    term = None
    deadline = time.monotonic() + 60
    while term is None:  # an Autopilot replica holds the lease before the fault
        if time.monotonic() > deadline:
            raise AssertionError("no Autopilot replica holds the lease on the Redis master")
        term = await asyncio.to_thread(autopilot_term, compose)
        await asyncio.sleep(0.5)
    tokens = [term[0]]
    killed_at = time.monotonic()
    await asyncio.to_thread(compose.kill, master)
    gap = None
    promoted = master
    previous_left: float | None = None
    while time.monotonic() - killed_at < within_s:
        promoted = await asyncio.to_thread(lambda: _quiet(redis_master, compose) or master)
        now_term = await asyncio.to_thread(autopilot_term, compose) if promoted != master else None
        if now_term is not None:
            token, left = now_term
            if token != tokens[-1]:
                tokens.append(token)
            # Held: the key's time left went up since the last look (a renewal on the new master).
            if previous_left is not None and left > previous_left and gap is None:
                gap = time.monotonic() - killed_at
            previous_left = left
            if gap is not None and time.monotonic() - killed_at > gap + 3:
                break
        await asyncio.sleep(0.3)
    if gap is None:
        raise AssertionError(f"no Autopilot lease held {within_s:.0f} s after killing {master}")
    await asyncio.to_thread(compose.start, master)
    role = ""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        info = await asyncio.to_thread(lambda: _quiet(redis_admin, compose, master, "ROLE") or "")
        role = info.split()[0] if info else ""
        if role == "slave":
            break
        await asyncio.sleep(1.0)
    decreases = sum(1 for a, b in itertools.pairwise(tokens) if b < a)
    return RedisFailover(master, promoted, gap, tokens, decreases, role)


def _quiet(fn: Callable[..., str], *args: object) -> str | None:
    try:
        return fn(*args)
    except DockerError:
        return None
