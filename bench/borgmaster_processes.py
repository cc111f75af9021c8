"""Borgmaster processes for the benchmarks: a migrated database, replica processes, fleets.

Not a benchmark module itself (its name does not start with ``bench_``): ``bench_borgmaster``,
``bench_borgmaster_scale`` and ``bench_borgmaster_cell`` share it. Every process speaks mTLS with the stack's
certificates and connects to PostgreSQL as its own account, as on a real stack.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from sqlalchemy import make_url

from cellpilot.api.v1 import (
    borgmaster_pb2,
    borgmaster_pb2_grpc,
    job_pb2,
    link_shard_pb2,
    link_shard_pb2_grpc,
    machine_pb2,
    resources_pb2,
    state_pb2,
)
from cellpilot.platform.postgres import apply_migrations, ensure_database
from cellpilot.platform.settings import PlatformSettings
from cellpilot.security.identity import ADMIN
from cellpilot.security.tls import SecuritySettings
from cellpilot.stack import Stack, StackEndpoints
from cellpilot.stack.config import free_port


@dataclass(frozen=True)
class BenchEndpoints(StackEndpoints):
    """The stack's endpoints plus the administrator's PostgreSQL URL (to make databases)."""

    admin_postgres_url: str = ""

    @classmethod
    def of(cls, stack: Stack, endpoints: StackEndpoints) -> BenchEndpoints:
        return cls(**vars(endpoints), admin_postgres_url=stack.admin_endpoints.postgres_url)


GIB = 1 << 30
FLEETS = 2  # Borglet processes in fleet mode
REPLICAS = 3  # Borgmaster replica processes
# What a benchmark retries while there is no master: a refused call on a follower, a dead replica.
RETRIED = (
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
)


def job_spec(name: str, tasks: int = 1) -> job_pb2.JobSpec:
    return job_pb2.JobSpec(
        name=name,
        user="bench",
        priority=9,
        app_class=job_pb2.APP_CLASS_LATENCY_SENSITIVE,
        task_count=tasks,
        task=job_pb2.TaskSpec(
            limits=resources_pb2.Resources(cpu_millicores=100, memory_bytes=GIB // 4),
            # Usage well inside the limits: the "steady" model's defaults (500 millicores,
            # 256 MiB) would hit the 256 MiB hard limit and OOM-loop the tasks.
            runtime=job_pb2.RuntimeSpec(
                simulated=job_pb2.SimulatedRuntime(
                    usage_model="steady", params={"cpu_millicores": 50.0, "memory_bytes": 64.0 * (1 << 20)}
                )
            ),
        ),
    )


async def database(endpoints: BenchEndpoints) -> str:
    """A new, migrated database; its URL names no user, so each process connects as its own
    account (the Borgmaster's role, its password beside the certificates) as on a real stack."""
    name = f"bench_{uuid.uuid4().hex[:10]}"
    admin_url = str(make_url(endpoints.admin_postgres_url).set(database=name))
    await ensure_database(admin_url)
    await apply_migrations(admin_url)
    return str(make_url(endpoints.postgres_url).set(database=name))


def tls_env(security: SecuritySettings) -> dict[str, str]:
    """What a process the benchmark starts needs to speak mTLS with the stack's certificates."""
    return {"CELLPILOT_TLS_MODE": security.tls_mode, "CELLPILOT_CERTS_DIR": str(security.certs_dir)}


def admin_channel(address: str, security: SecuritySettings) -> grpc.aio.Channel:
    """A channel whose calls are made by an admin user (the client certificate plus a token)."""
    signer = security.token_signer()
    transport = security.channel_credentials()
    assert signer is not None, "the stack issued no token secret"
    assert transport is not None, "the stack issued no certificates"
    token = signer.issue_for("root", capabilities=[ADMIN], ttl_s=3600)
    credentials = grpc.composite_channel_credentials(transport, grpc.access_token_call_credentials(token))
    return grpc.aio.secure_channel(address, credentials)


class ServiceProcess:
    """A service process (``python -m <module>``) the benchmark starts and stops, its output in
    ``log``; ``stop`` ends it with SIGTERM, then SIGKILL."""

    def __init__(self, module: str, log: Path, env: dict[str, str]) -> None:
        self.module = module
        self.log = log
        self.env = env
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", self.module],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,
            )

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def exited(self) -> str:
        """Why the process is gone (its exit code and the end of its log), or "" while it runs."""
        if self.process is None or self.process.poll() is None:
            return ""
        tail = self.log.read_text(errors="replace").strip().splitlines()[-5:]
        return f"{self.module} exited with {self.process.returncode}: " + " | ".join(tail)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


def _service_env(
    url: str, endpoints: StackEndpoints, log_dir: Path, security: SecuritySettings
) -> dict[str, str]:
    return {
        **os.environ,
        "CELLPILOT_STACK_ENV": str(log_dir / "none.env"),
        "CELLPILOT_POSTGRES_URL": url,
        "CELLPILOT_KAFKA_BOOTSTRAP": endpoints.kafka_bootstrap,
        "CELLPILOT_LOG_LEVEL": "WARNING",
        **tls_env(security),
    }


class Replica(ServiceProcess):
    """A Borgmaster replica process (its gRPC port free, its /metrics on any free port)."""

    def __init__(
        self,
        url: str,
        endpoints: StackEndpoints,
        index: int,
        log_dir: Path,
        security: SecuritySettings,
        **env: str,
    ) -> None:
        self.address = f"127.0.0.1:{free_port()}"
        super().__init__(
            "cellpilot_services.borgmaster",
            log_dir / f"borgmaster-{index}-{uuid.uuid4().hex[:4]}.log",
            {
                **_service_env(url, endpoints, log_dir, security),
                "CELLPILOT_REPLICA_INDEX": str(index),
                "CELLPILOT_BORGMASTER_PORT": self.address.rsplit(":", 1)[1],
                "CELLPILOT_BORGMASTER_METRICS_PORT": "0",
                "CELLPILOT_BORGMASTER_APPLY_MIGRATIONS": "false",
                "CELLPILOT_BORGMASTER_PUBLISH_EVENTS": "false",
                **env,
            },
        )


class SchedulerProcess(ServiceProcess):
    """The cell's scheduler process (Borg §3.4): follows the log, proposes placements to the
    master among ``masters`` (its ports free)."""

    def __init__(
        self,
        url: str,
        endpoints: StackEndpoints,
        masters: list[str],
        log_dir: Path,
        security: SecuritySettings,
    ) -> None:
        super().__init__(
            "cellpilot_services.scheduler",
            log_dir / f"scheduler-{uuid.uuid4().hex[:4]}.log",
            {
                **_service_env(url, endpoints, log_dir, security),
                "CELLPILOT_SCHEDULER_PORT": str(free_port()),
                "CELLPILOT_SCHEDULER_METRICS_PORT": "0",
                "CELLPILOT_SCHEDULER_BORGMASTER_ADDRESSES": ",".join(masters),
            },
        )


async def elected_leader(
    channels: dict[str, grpc.aio.Channel],
    within: float = 60.0,
    replicas: Sequence[ServiceProcess] | None = None,
) -> str:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        gone = [r.exited() for r in replicas or ()]
        if gone and all(gone):  # say why at once rather than after ``within``
            raise RuntimeError(f"no Borgmaster was elected: {'; '.join(gone)}")
        for address, channel in channels.items():
            try:
                who = await borgmaster_pb2_grpc.BorgmasterStub(channel).GetLeader(
                    borgmaster_pb2.GetLeaderRequest(), timeout=1.0
                )
            except grpc.aio.AioRpcError:
                continue
            if who.is_leader:
                return address
        await asyncio.sleep(0.1)
    raise TimeoutError("no Borgmaster was elected")


async def grant(stub: borgmaster_pb2_grpc.BorgmasterStub) -> None:
    limit = resources_pb2.Resources(
        cpu_millicores=1 << 40, memory_bytes=1 << 60, disk_bytes=1 << 60, ports=1 << 20
    )
    await stub.SetQuota(
        borgmaster_pb2.SetQuotaRequest(
            request_id=uuid.uuid4().hex, user="bench", band=job_pb2.PRIORITY_BAND_PRODUCTION, limit=limit
        )
    )


def polling_master(
    url: str, endpoints: BenchEndpoints, security: SecuritySettings, poll_timeout_s: float
) -> Any:
    """A Borgmaster in this process that polls every machine itself (no link shards), and only
    when the benchmark tells it to: the single-master baseline of the poll-cycle figures."""
    from cellpilot_services.borgmaster.borgmaster_service import Borgmaster
    from cellpilot_services.borgmaster.settings import BorgmasterSettings

    settings = BorgmasterSettings(
        platform=PlatformSettings(
            postgres_url=url,
            kafka_bootstrap=endpoints.kafka_bootstrap,
            certs_dir=Path(endpoints.certs_dir),
            log_level="WARNING",
        ),
        security=security,
        port=0,
        apply_migrations=False,
        publish_events=False,
        link_shards=False,
        poll_interval_s=3600,
        poll_timeout_s=poll_timeout_s,
        lease_s=30,
        renew_interval_s=2,
    )
    return Borgmaster(settings)


# ---------------------------------------------------------------------- fleets
def _machine_prefix(index: int) -> str:
    return "machine" if index == 0 else f"machine-r0-fleet{index}"


class Fleets:
    """``FLEETS`` Borglet processes in fleet mode hosting ``machines`` simulated machines."""

    def __init__(self, machines: int, masters: list[str], log_dir: Path, security: SecuritySettings) -> None:
        self.processes: list[subprocess.Popen[bytes]] = []
        per = machines // FLEETS
        for index in range(FLEETS):
            env = {
                **os.environ,
                "CELLPILOT_STACK_ENV": str(log_dir / "none.env"),
                "CELLPILOT_LOG_LEVEL": "WARNING",
                "CELLPILOT_REPLICA_INDEX": str(index),
                # The stack's Borglet certificate (borglet-r0) covers machine-r0-*: every
                # fleet reports under it, each with machine names of its own.
                "CELLPILOT_BORGLET_IDENTITY": "borglet-r0",
                "CELLPILOT_BORGLET_MACHINE_ID_PREFIX": _machine_prefix(index),
                "CELLPILOT_BORGLET_FLEET_SIZE": str(per),
                "CELLPILOT_BORGLET_LISTEN_ADDRESS": f"127.0.0.1:{free_port()}",
                "CELLPILOT_BORGLET_BORGMASTER_ADDRESSES": ",".join(masters),
                "CELLPILOT_BORGLET_PUBLISH_SAMPLES": "false",
                "CELLPILOT_BORGLET_CGROUP_ROOT": "none",
                **tls_env(security),
            }
            with open(log_dir / f"fleet-{index}.log", "ab") as out:
                self.processes.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "cellpilot_services.borglet"],
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        env=env,
                        start_new_session=True,
                    )
                )

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def stop_all(replicas: list[Replica]) -> None:
    for replica in replicas:
        replica.stop()


async def until(
    what: str, check: Callable[[], Awaitable[tuple[bool, str]]], within: float, every: float = 1.0
) -> None:
    deadline = time.monotonic() + within
    while True:
        done, progress = await check()
        if done:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {within:.0f} s ({progress})")
        await asyncio.sleep(every)


# ---------------------------------------------------------------------- following the master
class Master:
    """Reads that only the master answers, sent to whichever replica is the master now.

    A follower answers GetLinkShards with FAILED_PRECONDITION without naming the master, so the
    master is looked up first (GetLeader, the election's own answer) and asked again after a
    refusal or a replica that went away, until ``within``.
    """

    def __init__(self, channels: dict[str, grpc.aio.Channel], replicas: list[Replica]) -> None:
        self.channels = channels
        self.replicas = replicas
        self.epochs: list[int] = []  # the masters' epochs seen, in order

    async def call(self, rpc: Callable[[grpc.aio.Channel], Awaitable[Any]], within: float = 120.0) -> Any:
        deadline = time.monotonic() + within
        while True:
            leader = await elected_leader(
                self.channels, within=max(1.0, deadline - time.monotonic()), replicas=self.replicas
            )
            try:
                return await rpc(self.channels[leader])
            except grpc.aio.AioRpcError as error:
                if error.code() not in RETRIED or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)  # the master changed between the two calls: ask again

    async def link_shards(self) -> link_shard_pb2.GetLinkShardsResponse:
        status: link_shard_pb2.GetLinkShardsResponse = await self.call(
            lambda channel: link_shard_pb2_grpc.LinkShardsStub(channel).GetLinkShards(
                link_shard_pb2.GetLinkShardsRequest(), timeout=30
            )
        )
        if not self.epochs or self.epochs[-1] != status.master_epoch:
            if self.epochs:
                print(
                    f"  a new master (epoch {self.epochs[-1]} -> {status.master_epoch}): "
                    "the previous one lost its lease",
                    flush=True,
                )
            self.epochs.append(status.master_epoch)
        return status

    async def machines(self) -> list[machine_pb2.Machine]:
        found: list[machine_pb2.Machine] = []
        token = ""
        while True:
            request = borgmaster_pb2.ListMachinesRequest(page_size=5_000, page_token=token)

            async def page_of(channel: grpc.aio.Channel, r: Any = request) -> Any:
                return await borgmaster_pb2_grpc.BorgmasterStub(channel).ListMachines(r, timeout=30)

            page = await self.call(page_of)
            found.extend(page.machines)
            token = page.next_page_token
            if not token:
                return found

    async def cell_status(self) -> borgmaster_pb2.GetCellStatusResponse:
        """The master's GetCellStatus (its counts are the master's: a follower's are 0)."""
        while True:
            status: borgmaster_pb2.GetCellStatusResponse = await self.call(
                lambda channel: borgmaster_pb2_grpc.BorgmasterStub(channel).GetCellStatus(
                    borgmaster_pb2.GetCellStatusRequest(), timeout=30
                )
            )
            if status.is_leader:
                return status
            await asyncio.sleep(0.5)  # it stepped down between GetLeader and the call: ask again

    async def job(self, job_id: str) -> state_pb2.JobStatus:
        """The job with its tasks (soft state: the master answers)."""
        request = borgmaster_pb2.GetJobRequest(job_id=job_id, include_tasks=True)
        response = await self.call(
            lambda channel: borgmaster_pb2_grpc.BorgmasterStub(channel).GetJob(request, timeout=30)
        )
        job: state_pb2.JobStatus = response.job
        return job

    async def job_ids(self) -> set[str]:
        ids: set[str] = set()
        token = ""
        while True:
            request = borgmaster_pb2.ListJobsRequest(page_size=5_000, page_token=token)

            async def page_of(channel: grpc.aio.Channel, r: Any = request) -> Any:
                return await borgmaster_pb2_grpc.BorgmasterStub(channel).ListJobs(r, timeout=60)

            page = await self.call(page_of)
            ids.update(job.job_id for job in page.jobs)
            token = page.next_page_token
            if not token:
                return ids
