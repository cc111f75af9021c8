"""Builders for Borgmaster integration tests: settings, in-process and subprocess replicas, API specs."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import grpc
from cell_scheduler import SCHEDULER_FAST, scheduler
from stack_security import user_channel

from cellpilot.api.v1 import borgmaster_pb2, borgmaster_pb2_grpc, job_pb2, machine_pb2, resources_pb2
from cellpilot.platform.settings import PlatformSettings
from cellpilot.stack import StackEndpoints
from cellpilot.stack.config import free_port
from cellpilot_services.borgmaster.borgmaster_service import Borgmaster
from cellpilot_services.borgmaster.settings import BorgmasterSettings

GIB = 1 << 30
T = TypeVar("T")
FAST = {
    # Short enough for quick elections, long enough that a loaded CI machine (two test workers,
    # the stores and the Borglets on two cores) stalling an event loop for a second or two does
    # not make a healthy master miss its renewal and step down mid-test.
    "lease_s": 3.0,
    "renew_interval_s": 0.5,
    "election_interval_s": 0.25,
    "tail_interval_s": 0.1,
    "schedule_interval_s": 0.1,
    "poll_interval_s": 0.5,
    "poll_timeout_s": 0.5,
}


def settings(
    database_url: str, endpoints: StackEndpoints, index: int = 0, **overrides: Any
) -> BorgmasterSettings:
    values: dict[str, Any] = {
        "platform": PlatformSettings(
            postgres_url=database_url, kafka_bootstrap=endpoints.kafka_bootstrap, log_json=False
        ),
        "replica_index": index,
        # replica_index is read from the environment by its alias; the id is given outright.
        "replica_id": f"borgmaster-{index}",
        "port": 0,
        "apply_migrations": False,
        "publish_events": False,
        **FAST,
        **overrides,
    }
    return BorgmasterSettings(**values)


@asynccontextmanager
async def replicas(
    database_url: str, endpoints: StackEndpoints, count: int = 1, schedulers: int = 1, **overrides: Any
) -> AsyncIterator[list[Borgmaster]]:
    """``count`` Borgmaster replicas and ``schedulers`` scheduler loops, in this process."""
    masters = [Borgmaster(settings(database_url, endpoints, i, **overrides)) for i in range(count)]
    async with contextlib.AsyncExitStack() as stack:
        try:
            for master in masters:
                await master.start()
            for i in range(schedulers):
                await stack.enter_async_context(
                    scheduler([m.address for m in masters], masters[0].settings, i)
                )
            yield masters
        finally:
            await stack.aclose()
            for master in masters:
                await master.stop()


async def eventually(check: Callable[[], Awaitable[T | None]], within: float = 10.0, what: str = "") -> T:
    deadline = time.monotonic() + within
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what or check}")
        await asyncio.sleep(0.05)


async def retried_write(call: Callable[[], Awaitable[T]], within: float = 15.0) -> T:
    """A write made as borgmaster.proto tells clients to: retried with the same request_id while
    the replica answers UNAVAILABLE. With the harness's short lease a loaded machine can make
    even a lone master miss a renewal, step down and take over again a moment later."""
    deadline = time.monotonic() + within
    while True:
        try:
            return await call()
        except grpc.aio.AioRpcError as error:
            if error.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.1)


async def leader_of(masters: list[Borgmaster], within: float = 10.0) -> Borgmaster:
    async def find() -> Borgmaster | None:
        leaders = [m for m in masters if m.replica.is_leader]
        return leaders[0] if len(leaders) == 1 else None

    return await eventually(find, within, "one elected master")


def stub(address: str) -> tuple[grpc.aio.Channel, borgmaster_pb2_grpc.BorgmasterStub]:
    """A stub calling as the admin user (mTLS + bearer token), as the tests' operator."""
    channel = user_channel(address)
    return channel, borgmaster_pb2_grpc.BorgmasterStub(channel)


def simulated_job(
    name: str,
    user: str = "alice",
    priority: int = 9,
    tasks: int = 1,
    cpu: int = 500,
    memory: int = GIB,
    **kw: Any,
) -> job_pb2.JobSpec:
    return job_pb2.JobSpec(
        name=name,
        user=user,
        priority=priority,
        app_class=job_pb2.APP_CLASS_LATENCY_SENSITIVE,
        task_count=tasks,
        task=job_pb2.TaskSpec(
            limits=resources_pb2.Resources(cpu_millicores=cpu, memory_bytes=memory),
            runtime=job_pb2.RuntimeSpec(simulated=job_pb2.SimulatedRuntime(usage_model="steady")),
        ),
        **kw,
    )


def machine(machine_id: str, address: str = "127.0.0.1:1", cpu: int = 8000, memory: int = 16 * GIB) -> Any:
    return machine_pb2.MachineSpec(
        machine_id=machine_id,
        borglet_address=address,
        capacity=resources_pb2.Resources(
            cpu_millicores=cpu, memory_bytes=memory, disk_bytes=100 * GIB, ports=100
        ),
        first_port=20000,
    )


async def grant(
    client: borgmaster_pb2_grpc.BorgmasterStub, user: str, cores: int = 1000, memory_gib: int = 0
) -> None:
    for band in (job_pb2.PRIORITY_BAND_PRODUCTION, job_pb2.PRIORITY_BAND_BATCH):
        await client.SetQuota(
            borgmaster_pb2.SetQuotaRequest(
                request_id=f"quota-{user}-{band}-{uuid.uuid4().hex[:6]}",
                user=user,
                band=band,
                limit=resources_pb2.Resources(
                    cpu_millicores=cores * 1000,
                    memory_bytes=(memory_gib or cores * 4) * GIB,
                    disk_bytes=1 << 50,
                    ports=100000,
                ),
            )
        )


class ServiceProcess:
    """``python -m cellpilot_services.<module>`` as a subprocess, with its log in a file."""

    module = "borgmaster"

    def __init__(
        self, database_url: str, endpoints: StackEndpoints, index: int, log_dir: Path, **env: str
    ) -> None:
        self.index = index
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log_path = log_dir / f"{self.module}-{index}.log"
        self.env = {
            **os.environ,
            "CELLPILOT_STACK_ENV": str(log_dir / "none.env"),
            "CELLPILOT_POSTGRES_URL": database_url,
            "CELLPILOT_KAFKA_BOOTSTRAP": endpoints.kafka_bootstrap,
            "CELLPILOT_LOG_JSON": "false",
            "CELLPILOT_REPLICA_INDEX": str(index),
            **self.own_env(),
            **env,
        }
        self.process: subprocess.Popen[bytes] | None = None

    def own_env(self) -> dict[str, str]:
        return {
            "CELLPILOT_BORGMASTER_PORT": str(self.port),
            "CELLPILOT_BORGMASTER_METRICS_PORT": "0",
            "CELLPILOT_BORGMASTER_APPLY_MIGRATIONS": "false",
            **{f"CELLPILOT_BORGMASTER_{k.upper()}": str(v) for k, v in FAST.items()},
        }

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", f"cellpilot_services.{self.module}"],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,
            )

    def signal(self, sig: int) -> None:
        assert self.process is not None
        os.kill(self.process.pid, sig)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        with_timeout = [signal.SIGCONT, signal.SIGTERM]
        for sig in with_timeout:
            try:
                os.kill(self.process.pid, sig)
            except ProcessLookupError:
                return
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)


class ReplicaProcess(ServiceProcess):
    """A Borgmaster replica as a subprocess."""


class SchedulerProcess(ServiceProcess):
    """The scheduler (Borg §3.4) as a subprocess, proposing to the replicas at ``masters``."""

    module = "scheduler"

    def __init__(
        self,
        database_url: str,
        endpoints: StackEndpoints,
        masters: list[str],
        log_dir: Path,
        index: int = 0,
        **env: str,
    ) -> None:
        self.masters = masters
        super().__init__(database_url, endpoints, index, log_dir, **env)

    def own_env(self) -> dict[str, str]:
        return {
            "CELLPILOT_SCHEDULER_PORT": str(self.port),
            "CELLPILOT_SCHEDULER_METRICS_PORT": "0",
            "CELLPILOT_SCHEDULER_BORGMASTER_ADDRESSES": ",".join(self.masters),
            **{f"CELLPILOT_SCHEDULER_{k.upper()}": str(v) for k, v in SCHEDULER_FAST.items()},
        }


# ---------------------------------------------------------------------- Borglets and events
MIB = 1 << 20
WORKLOAD = [sys.executable, "-m", "cellpilot_services.borglet.workload_program"]


def borglet_settings(endpoints: StackEndpoints, masters: list[str], **overrides: Any) -> Any:
    from cellpilot_services.borglet.settings import BorgletSettings

    values: dict[str, Any] = {
        "platform": PlatformSettings(kafka_bootstrap=endpoints.kafka_bootstrap, log_json=False),
        "machine_id_prefix": f"bm-{uuid.uuid4().hex[:6]}",
        "borgmaster_addresses": masters,
        "publish_samples": False,
        "cgroup_root": "none",
        "memory_bytes": 8 << 30,
        "cpu_millicores": 8000,
        **overrides,
    }
    return BorgletSettings(**values)


@asynccontextmanager
async def borglet(endpoints: StackEndpoints, masters: list[str], **overrides: Any) -> AsyncIterator[Any]:
    """An in-process Borglet (the Borglet engineer's service) registering with ``masters``."""
    from cellpilot_services.borglet.borglet_service import Borglet

    agent = Borglet(borglet_settings(endpoints, masters, **overrides))
    await agent.start()
    try:
        yield agent
    finally:
        await agent.stop()


class BorgletProcess:
    """``python -m cellpilot_services.borglet`` hosting one machine, so it can be paused (SIGSTOP)."""

    def __init__(self, endpoints: StackEndpoints, masters: list[str], machine_id: str, log_dir: Path) -> None:
        self.machine_id = machine_id
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log_path = log_dir / f"borglet-{machine_id}.log"
        self.env = {
            **os.environ,
            "CELLPILOT_STACK_ENV": str(log_dir / "none.env"),
            "CELLPILOT_KAFKA_BOOTSTRAP": endpoints.kafka_bootstrap,
            "CELLPILOT_LOG_JSON": "false",
            "CELLPILOT_BORGLET_MACHINE_IDS": machine_id,
            "CELLPILOT_BORGLET_LISTEN_ADDRESS": self.address,
            "CELLPILOT_BORGLET_BORGMASTER_ADDRESSES": ",".join(masters),
            "CELLPILOT_BORGLET_PUBLISH_SAMPLES": "false",
            "CELLPILOT_BORGLET_CGROUP_ROOT": "none",
        }
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "cellpilot_services.borglet"],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,
            )

    def signal(self, sig: int) -> None:
        assert self.process is not None
        os.kill(self.process.pid, sig)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        for sig in (signal.SIGCONT, signal.SIGTERM):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, sig)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)


class EventLog:
    """Reads ``borg.events`` in the background, keeping the events of the given users' jobs."""

    def __init__(self, bootstrap: str, users: set[str]) -> None:
        from stream_writers import observer

        from cellpilot.platform.kafka_consumers import MessageConsumer

        self.users = users
        self.consumer = MessageConsumer(
            observer(bootstrap), ["borg.events"], group_id=f"bm-test-{uuid.uuid4().hex[:8]}"
        )
        self.events: list[Any] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> EventLog:
        await self.consumer.start()
        self._task = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        from cellpilot.api.v1 import state_pb2

        async for batch in self.consumer.batches(timeout_ms=200):
            for record in batch:
                if record.key.split("/")[0] in self.users:
                    self.events.append(record.decode(state_pb2.BorgEvent))

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.consumer.stop()

    def task_events(self, job_id: str) -> list[Any]:
        return [e.task for e in self.events if e.WhichOneof("event") == "task" and e.task.job_id == job_id]
