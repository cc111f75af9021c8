"""The Borgmaster service on the embedded stack: submit throughput, failover time, poll cycle.

* ``submit_jobs_per_s``: SubmitJob through gRPC to one replica process (its log in
  PostgreSQL; every submission appended, fenced by the epoch, before it is acknowledged),
  64 clients with a request each in flight, 2 000 one-task jobs, with group commit
  (concurrent requests share one fenced append, Borg §3.1). Baselines in the same run:
  ``submit_one_txn_per_request_jobs_per_s``, the same with ``commit_batch_max = 1`` (one
  PostgreSQL transaction per request; the same number of jobs, so the pending queue the
  scheduler walks grows alike), and ``submit_group_commit_vs_one_txn`` the ratio;
  ``raw_append_records_per_s``, the same serialised ``JobSubmitted`` records appended with
  :class:`CheckpointLog` one transaction each, and ``submit_vs_raw_append`` the ratio of
  the grouped service to it (above 1: the service outruns one transaction per record).
  Every gRPC hop runs with mTLS and the security interceptor, as a real stack does.
* ``failover_s``: three replica processes with the default lease (3 s, renewed every 1 s,
  followers trying every 0.5 s); SIGKILL the master, then time until some replica accepts
  a write. Mean of 3 trials (the killed replica is restarted between trials). Borg §3.1
  reports about 10 s. Baseline: ``graceful_handover_s``, the same with SIGTERM (the master
  releases its lease, so no lease has to expire); ``failover_vs_graceful_handover`` is the
  ratio — what waiting out a dead master's lease costs.
* ``poll_cycle_1000_machines_s``: one Borglet process in fleet mode hosting 1 000 simulated
  machines (2 000 running tasks), registered with an in-process master; one full poll
  cycle — 1 000 concurrent Poll RPCs, every report diffed against the state, the result
  committed — median of 3. Baseline: ``raw_poll_fanout_1000_machines_s``, the same 1 000
  Poll RPCs with nothing done with the answers; ``poll_cycle_vs_raw_fanout`` is the ratio.
"""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import grpc
from sqlalchemy import make_url

from bench.harness import Report
from cellpilot.api.v1 import (
    borglet_pb2,
    borglet_pb2_grpc,
    borgmaster_pb2,
    borgmaster_pb2_grpc,
    checkpoint_pb2,
    job_pb2,
    resources_pb2,
)
from cellpilot.platform.postgres import apply_migrations, create_engine, ensure_database
from cellpilot.platform.settings import PlatformSettings
from cellpilot.security.identity import ADMIN
from cellpilot.security.tls import SecuritySettings
from cellpilot.stack import Stack, StackConfig, StackEndpoints
from cellpilot.stack.config import free_port

FIGURES = [
    "borgmaster.submit_jobs_per_s",
    "borgmaster.submit_one_txn_per_request_jobs_per_s",
    "borgmaster.submit_group_commit_vs_one_txn",
    "borgmaster.raw_append_records_per_s",
    "borgmaster.submit_vs_raw_append",
    "borgmaster.failover_s",
    "borgmaster.graceful_handover_s",
    "borgmaster.failover_vs_graceful_handover",
    "borgmaster.poll_cycle_1000_machines_s",
    "borgmaster.raw_poll_fanout_1000_machines_s",
    "borgmaster.poll_cycle_vs_raw_fanout",
]
SUBMITS = 2_000
RAW_APPENDS = 1_000
IN_FLIGHT = 64
MACHINES = 1_000
TASKS = 2_000
GIB = 1 << 30


def _spec(name: str, tasks: int = 1) -> job_pb2.JobSpec:
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


async def _database(endpoints: StackEndpoints) -> str:
    url = str(make_url(endpoints.postgres_url).set(database=f"bench_{uuid.uuid4().hex[:10]}"))
    await ensure_database(url)
    await apply_migrations(url)
    return url


def _tls_env(security: SecuritySettings) -> dict[str, str]:
    """What a process the benchmark starts needs to speak mTLS with the stack's certificates."""
    return {"CELLPILOT_TLS_MODE": security.tls_mode, "CELLPILOT_CERTS_DIR": str(security.certs_dir)}


def _admin_channel(address: str, security: SecuritySettings) -> grpc.aio.Channel:
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
            **_tls_env(security),
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


async def _leader(
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


async def _grant(stub: borgmaster_pb2_grpc.BorgmasterStub) -> None:
    limit = resources_pb2.Resources(
        cpu_millicores=1 << 40, memory_bytes=1 << 60, disk_bytes=1 << 60, ports=1 << 20
    )
    await stub.SetQuota(
        borgmaster_pb2.SetQuotaRequest(
            request_id=uuid.uuid4().hex, user="bench", band=job_pb2.PRIORITY_BAND_PRODUCTION, limit=limit
        )
    )


# ---------------------------------------------------------------------- submit throughput
async def _raw_append_rate(endpoints: StackEndpoints, count: int) -> float:
    from cellpilot_services.borgmaster.checkpoint_log import CheckpointLog
    from cellpilot_services.borgmaster.leader_lease import LeaderLease

    url = await _database(endpoints)
    engine = create_engine(url)
    try:
        leader_lease = LeaderLease(engine, "bench", "bench:1", 60)
        lease = await leader_lease.try_acquire()
        assert lease is not None
        log = CheckpointLog(engine)
        records = [
            checkpoint_pb2.CheckpointRecord(
                sequence=i + 1,
                epoch=lease.epoch,
                request_id=f"raw-{i}",
                job_submitted=checkpoint_pb2.JobSubmitted(job_id=f"bench/raw-{i}", spec=_spec(f"raw-{i}")),
            ).SerializeToString()
            for i in range(count)
        ]
        started = time.perf_counter()
        for i, record in enumerate(records):
            await log.append(lease.epoch, i + 1, [("job_submitted", record)])
        rate = count / (time.perf_counter() - started)
        await leader_lease.release(lease.epoch)  # nobody need wait the 60 s lease out
        return rate
    finally:
        await engine.dispose()


async def _submit_rate(
    endpoints: StackEndpoints, log_dir: Path, security: SecuritySettings, count: int, batch_max: int = 0
) -> float:
    """SubmitJob rate with ``IN_FLIGHT`` concurrent clients (``batch_max``: the group-commit cap,
    0 for the default)."""
    url = await _database(endpoints)
    env = {"CELLPILOT_BORGMASTER_COMMIT_BATCH_MAX": str(batch_max)} if batch_max else {}
    replica = Replica(url, endpoints, 0, log_dir, security, **env)
    replica.start()
    channel = _admin_channel(replica.address, security)
    try:
        await _leader({replica.address: channel}, replicas=[replica])
        stub = borgmaster_pb2_grpc.BorgmasterStub(channel)
        await _grant(stub)
        gate = asyncio.Semaphore(IN_FLIGHT)

        async def submit(name: str) -> None:
            async with gate:
                await stub.SubmitJob(borgmaster_pb2.SubmitJobRequest(request_id=name, spec=_spec(name)))

        await asyncio.gather(*(submit(f"warm-{i}") for i in range(200)))
        started = time.perf_counter()
        await asyncio.gather(*(submit(f"job-{i}") for i in range(count)))
        return count / (time.perf_counter() - started)
    finally:
        await channel.close()
        replica.stop()


# ---------------------------------------------------------------------- failover
# What a client retries while there is no master: a refused write on a follower, a dead replica.
RETRIED = (
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
)


async def _first_write(channels: dict[str, grpc.aio.Channel], skip: str, label: str) -> None:
    """Submits to every replica but ``skip`` until one accepts."""
    n = 0
    while True:
        for address, channel in channels.items():
            if address == skip:
                continue
            n += 1
            name = f"{label}-{n}"
            request = borgmaster_pb2.SubmitJobRequest(request_id=name, spec=_spec(name))
            try:
                await borgmaster_pb2_grpc.BorgmasterStub(channel).SubmitJob(request, timeout=1.0)
            except grpc.aio.AioRpcError as error:
                if error.code() not in RETRIED:
                    raise
                continue
            return
        await asyncio.sleep(0.02)


async def _takeover_trials(
    endpoints: StackEndpoints, log_dir: Path, security: SecuritySettings, trials: int = 3
) -> tuple[list[float], list[float]]:
    """Seconds from the master's end to the first accepted write: SIGKILL, then SIGTERM.

    A killed master's lease has to expire (``lease_s``); one stopped with SIGTERM releases
    it, so a follower takes over at its next election attempt — the in-run baseline.
    """
    url = await _database(endpoints)
    replicas = [Replica(url, endpoints, i, log_dir, security) for i in range(3)]
    for replica in replicas:
        replica.start()
    channels = {r.address: _admin_channel(r.address, security) for r in replicas}
    times: dict[str, list[float]] = {"SIGKILL": [], "SIGTERM": []}
    try:
        leader = await _leader(channels, replicas=replicas)
        await _grant(borgmaster_pb2_grpc.BorgmasterStub(channels[leader]))
        for how in ("SIGKILL", "SIGTERM"):
            for trial in range(trials):
                leader = await _leader(channels)
                victim = next(r for r in replicas if r.address == leader)
                assert victim.process is not None
                victim.process.send_signal(signal.SIGKILL if how == "SIGKILL" else signal.SIGTERM)
                ended = time.monotonic()
                await _first_write(channels, victim.address, f"{how.lower()}-{trial}")
                times[how].append(time.monotonic() - ended)
                print(f"  {how} trial {trial + 1}: a write accepted {times[how][-1]:.2f} s after", flush=True)
                victim.stop()
                victim.start()  # back as a follower for the next trial
                await asyncio.sleep(1.0)
        return times["SIGKILL"], times["SIGTERM"]
    finally:
        for channel in channels.values():
            await channel.close()
        for replica in replicas:
            replica.stop()


# ---------------------------------------------------------------------- poll cycle
def _start_fleet(env: dict[str, str], log_dir: Path) -> subprocess.Popen[bytes]:
    with open(log_dir / "fleet.log", "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "cellpilot_services.borglet"],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )


async def _poll_cycle(
    endpoints: StackEndpoints, log_dir: Path, security: SecuritySettings
) -> tuple[float, float]:
    from cellpilot_services.borgmaster.borgmaster_service import Borgmaster
    from cellpilot_services.borgmaster.settings import BorgmasterSettings

    url = await _database(endpoints)
    settings = BorgmasterSettings(
        platform=PlatformSettings(
            postgres_url=url, kafka_bootstrap=endpoints.kafka_bootstrap, log_level="WARNING"
        ),
        security=security,
        port=0,
        apply_migrations=False,
        publish_events=False,
        poll_interval_s=3600,
        poll_timeout_s=30,
        lease_s=30,
        renew_interval_s=2,
    )
    master = Borgmaster(settings)
    await master.start()
    fleet_address = f"127.0.0.1:{free_port()}"
    env = {
        **os.environ,
        "CELLPILOT_STACK_ENV": str(log_dir / "none.env"),
        "CELLPILOT_LOG_LEVEL": "WARNING",
        "CELLPILOT_BORGLET_FLEET_SIZE": str(MACHINES),
        "CELLPILOT_BORGLET_LISTEN_ADDRESS": fleet_address,
        "CELLPILOT_BORGLET_BORGMASTER_ADDRESSES": master.address,
        "CELLPILOT_BORGLET_PUBLISH_SAMPLES": "false",
        "CELLPILOT_BORGLET_CGROUP_ROOT": "none",
        **_tls_env(security),
    }
    fleet = _start_fleet(env, log_dir)
    # The Polls of the raw fan-out are made as the Borgmaster makes them (its certificate).
    channel = grpc.aio.secure_channel(fleet_address, security.channel_credentials("borgmaster"))
    try:
        replica = master.replica
        deadline = time.monotonic() + 120
        while not (replica.is_leader and len(replica.state.machines) == MACHINES):
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(replica.state.machines)} machines registered")
            await asyncio.sleep(0.2)
        async with _admin_channel(master.address, security) as master_channel:
            stub = borgmaster_pb2_grpc.BorgmasterStub(master_channel)
            await _grant(stub)
            for j in range(TASKS // 40):
                await stub.SubmitJob(
                    borgmaster_pb2.SubmitJobRequest(request_id=f"fleet-{j}", spec=_spec(f"f{j}", 40))
                )
        deadline = time.monotonic() + 180
        while (running := sum(1 for _, t in replica.state.iter_tasks() if t.started)) < TASKS:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {running} of {TASKS} tasks reported running")
            await master.poller.cycle(sorted(replica.state.machines))
        machines = sorted(replica.state.machines)
        cycles = []
        for _ in range(3):
            cycles.append((await master.poller.cycle(machines)).seconds)
        borglet = borglet_pb2_grpc.BorgletStub(channel)
        gate = asyncio.Semaphore(settings.poll_concurrency)

        async def poll(machine_id: str) -> Any:
            async with gate:
                request = borglet_pb2.PollRequest(machine_id=machine_id, master_epoch=replica.epoch)
                return await borglet.Poll(request, timeout=30)

        raw = []
        for _ in range(3):
            started = time.perf_counter()
            await asyncio.gather(*(poll(m) for m in machines))
            raw.append(time.perf_counter() - started)
        return statistics.median(cycles), statistics.median(raw)
    finally:
        await channel.close()
        await master.stop()
        fleet.send_signal(signal.SIGTERM)
        try:
            fleet.wait(timeout=30)
        except subprocess.TimeoutExpired:
            fleet.kill()


def run(report: Report) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-borgmaster-") as tmp:
        base = Path(tmp)
        stack = Stack(StackConfig(base / "stack"))
        endpoints = stack.up()
        try:
            raw = asyncio.run(_raw_append_rate(endpoints, RAW_APPENDS))
            security = SecuritySettings(tls_mode="mtls", certs_dir=stack.config.certs_dir)
            one_txn = asyncio.run(_submit_rate(endpoints, base, security, SUBMITS, batch_max=1))
            submitted = asyncio.run(_submit_rate(endpoints, base, security, SUBMITS))
            where = f"gRPC SubmitJob, {IN_FLIGHT} in flight, log in PostgreSQL"
            report("borgmaster.submit_jobs_per_s", submitted, f"jobs/s ({where}, group commit)")
            report(
                "borgmaster.submit_one_txn_per_request_jobs_per_s",
                one_txn,
                f"jobs/s ({where}, commit_batch_max=1)",
            )
            report("borgmaster.submit_group_commit_vs_one_txn", submitted / one_txn, "x")
            report(
                "borgmaster.raw_append_records_per_s", raw, "records/s (CheckpointLog.append, same records)"
            )
            report("borgmaster.submit_vs_raw_append", submitted / raw, "x")
            killed, stopped = asyncio.run(_takeover_trials(endpoints, base, security))
            failover, handover = statistics.mean(killed), statistics.mean(stopped)
            report(
                "borgmaster.failover_s", failover, "s (SIGKILL master -> first accepted write; Borg ~10 s)"
            )
            report("borgmaster.graceful_handover_s", handover, "s (master SIGTERM, lease released -> write)")
            report("borgmaster.failover_vs_graceful_handover", failover / handover, "x")
            cycle, fanout = asyncio.run(_poll_cycle(endpoints, base, security))
            where = f"{MACHINES} machines in one Borglet fleet-mode process, {TASKS} tasks"
            report("borgmaster.poll_cycle_1000_machines_s", cycle, f"s ({where}: poll, diff, commit)")
            report("borgmaster.raw_poll_fanout_1000_machines_s", fanout, f"s ({where}: the Poll RPCs alone)")
            report("borgmaster.poll_cycle_vs_raw_fanout", cycle / fanout, "x")
        finally:
            stack.down()
