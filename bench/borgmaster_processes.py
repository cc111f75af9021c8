"""Borgmaster processes for the benchmarks: a migrated database, replica processes, fleets.

Not a benchmark module itself (its name does not start with ``bench_``): ``bench_borgmaster``
and ``bench_borgmaster_scale`` share it. Every process speaks mTLS with the stack's
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from sqlalchemy import make_url

from cellpilot.api.v1 import borgmaster_pb2, borgmaster_pb2_grpc, job_pb2, resources_pb2
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


class Replica:
    """A Borgmaster replica process."""

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
        self.log = log_dir / f"borgmaster-{index}-{uuid.uuid4().hex[:4]}.log"
        self.env = {
            **os.environ,
            "CELLPILOT_STACK_ENV": str(log_dir / "none.env"),
            "CELLPILOT_POSTGRES_URL": url,
            "CELLPILOT_KAFKA_BOOTSTRAP": endpoints.kafka_bootstrap,
            "CELLPILOT_LOG_LEVEL": "WARNING",
            "CELLPILOT_REPLICA_INDEX": str(index),
            "CELLPILOT_BORGMASTER_PORT": self.address.rsplit(":", 1)[1],
            "CELLPILOT_BORGMASTER_APPLY_MIGRATIONS": "false",
            "CELLPILOT_BORGMASTER_PUBLISH_EVENTS": "false",
            **tls_env(security),
            **env,
        }
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "cellpilot_services.borgmaster"],
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
        return f"replica {self.address} exited with {self.process.returncode}: " + " | ".join(tail)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


async def elected_leader(
    channels: dict[str, grpc.aio.Channel], within: float = 60.0, replicas: list[Replica] | None = None
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
