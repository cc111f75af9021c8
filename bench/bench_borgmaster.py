"""The Borgmaster service on the embedded stack: submit throughput, failover time, poll cycle.

* ``submit_jobs_per_s``: SubmitJob through gRPC to one replica process (its log in
  PostgreSQL; every submission appended, fenced by the epoch, before it is acknowledged),
  64 clients with a request each in flight, 2 000 one-task jobs, with group commit
  (concurrent requests share one fenced append, Borg §3.1), while a scheduler process places
  the submitted tasks on 1 000 simulated machines (two fleet-mode Borglets the master polls).
  Baselines in the same run:
  ``submit_one_txn_per_request_jobs_per_s``, the same with ``commit_batch_max = 1`` (one
  PostgreSQL transaction per request; the same jobs, fleet and scheduler), and
  ``submit_group_commit_vs_one_txn`` the ratio;
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
  cycle — the 1 000 polls (in ``PollMachines`` batches of ``poll_batch_max``, as the master
  polls a fleet-mode Borglet), every report diffed against the state, the result committed —
  median of 3. Baseline: ``raw_poll_fanout_1000_machines_s``, the same batched polls with
  nothing done with the answers; ``poll_cycle_vs_raw_fanout`` is the ratio.
"""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from bench.borgmaster_processes import (
    RETRIED,
    BenchEndpoints,
    Fleets,
    Master,
    Replica,
    SchedulerProcess,
    admin_channel,
    database,
    elected_leader,
    grant,
    job_spec,
    polling_master,
    tls_env,
    until,
)
from bench.harness import FULL, SMOKE, Report, embedded_stack, sized
from cellpilot.api.v1 import (
    borglet_pb2,
    borglet_pb2_grpc,
    borgmaster_pb2,
    borgmaster_pb2_grpc,
)
from cellpilot.platform.settings import PlatformSettings
from cellpilot.security.tls import SecuritySettings
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


@dataclass(frozen=True)
class Size:
    submits: int  # jobs timed per submit figure (after ``warm_submits``)
    warm_submits: int
    raw_appends: int
    in_flight: int
    submit_machines: int  # the fleet the submitted jobs' tasks are placed on
    trials: int  # per kind of takeover
    machines: int  # of the poll cycle's fleet
    tasks: int


SIZES = {
    FULL: Size(
        submits=2_000,
        warm_submits=200,
        raw_appends=1_000,
        in_flight=64,
        submit_machines=1_000,
        trials=3,
        machines=1_000,
        tasks=2_000,
    ),
    SMOKE: Size(
        submits=40,
        warm_submits=8,
        raw_appends=20,
        in_flight=8,
        submit_machines=10,
        trials=1,
        machines=10,
        tasks=20,
    ),
}
TASKS_PER_FLEET_JOB = 40


# ---------------------------------------------------------------------- submit throughput
async def _raw_append_rate(endpoints: BenchEndpoints, count: int) -> float:
    from cellpilot.borg.lifecycle import JobState
    from cellpilot.borg.mutations import JobSubmitted, to_records
    from cellpilot.borg_wire.specs import job_spec_in
    from cellpilot.checkpoint_store import PostgresCheckpointStore

    url = await database(endpoints)
    # As the Borgmaster's own account, which is what appends to the log.
    store = PostgresCheckpointStore.connect(
        PlatformSettings(postgres_url=url, certs_dir=Path(endpoints.certs_dir)).postgres_url_for("borgmaster")
    )
    try:
        lease = store.lease("bench", "bench:1", 60)
        term = await lease.try_acquire()
        assert term is not None
        specs = [job_spec_in(job_spec(f"raw-{i}")) for i in range(count)]
        records = [
            to_records(i + 1, term.token, 1_000, [JobSubmitted(s.job_id, s, JobState.PENDING)], f"raw-{i}")
            for i, s in enumerate(specs)
        ]
        started = time.perf_counter()
        for batch in records:
            await store.append(term.token, batch)
        rate = count / (time.perf_counter() - started)
        await lease.release()  # nobody need wait the 60 s lease out
        return rate
    finally:
        await store.close()


async def _submit_rate(
    endpoints: BenchEndpoints, log_dir: Path, security: SecuritySettings, size: Size, batch_max: int = 0
) -> float:
    """SubmitJob rate with ``size.in_flight`` concurrent clients (``batch_max``: the group-commit
    cap, 0 for the default), while a scheduler process places the submitted tasks on a
    fleet of ``size.submit_machines`` simulated machines (Borg §3.4: the master judges its
    proposals, and the Borglets' polls, between the clients' writes)."""
    url = await database(endpoints)
    env = {"CELLPILOT_BORGMASTER_COMMIT_BATCH_MAX": str(batch_max)} if batch_max else {}
    replica = Replica(url, endpoints, 0, log_dir, security, **env)
    replica.start()
    channel = admin_channel(replica.address, security)
    channels = {replica.address: channel}
    fleets = Fleets(size.submit_machines, [replica.address], log_dir, security)
    scheduler = SchedulerProcess(url, endpoints, [replica.address], log_dir, security)
    try:
        await elected_leader(channels, replicas=[replica])
        stub = borgmaster_pb2_grpc.BorgmasterStub(channel)
        await grant(stub)
        master = Master(channels, [replica])

        async def registered() -> tuple[bool, str]:
            n = len(await master.machines())
            return n == size.submit_machines, f"{n} machines registered"

        await until("fleet registration", registered, within=300, every=1.0)
        scheduler.start()
        gate = asyncio.Semaphore(size.in_flight)

        async def submit(name: str) -> None:
            async with gate:
                await stub.SubmitJob(borgmaster_pb2.SubmitJobRequest(request_id=name, spec=job_spec(name)))

        await asyncio.gather(*(submit(f"warm-{i}") for i in range(size.warm_submits)))

        async def placing() -> tuple[bool, str]:  # the scheduler is up and proposing
            s = await master.cell_status()
            return s.placements_accepted >= size.warm_submits, f"{s.placements_accepted} placements accepted"

        await until("the warm-up jobs placed", placing, within=300, every=0.5)
        before = await master.cell_status()
        started = time.perf_counter()
        await asyncio.gather(*(submit(f"job-{i}") for i in range(size.submits)))
        rate = size.submits / (time.perf_counter() - started)
        after = await master.cell_status()
        placed = after.placements_accepted - before.placements_accepted
        print(
            f"  {size.submits} jobs at {rate:.0f}/s (commit_batch_max {batch_max or 'default'}); "
            f"the scheduler had {placed} placements accepted meanwhile",
            flush=True,
        )
        if scheduler.exited():
            raise RuntimeError(f"the scheduler process died: {scheduler.exited()}")
        return rate
    finally:
        await channel.close()
        scheduler.stop()
        fleets.stop()
        replica.stop()


# ---------------------------------------------------------------------- failover
async def _first_write(channels: dict[str, grpc.aio.Channel], skip: str, label: str) -> None:
    """Submits to every replica but ``skip`` until one accepts."""
    n = 0
    while True:
        for address, channel in channels.items():
            if address == skip:
                continue
            n += 1
            name = f"{label}-{n}"
            request = borgmaster_pb2.SubmitJobRequest(request_id=name, spec=job_spec(name))
            try:
                await borgmaster_pb2_grpc.BorgmasterStub(channel).SubmitJob(request, timeout=1.0)
            except grpc.aio.AioRpcError as error:
                if error.code() not in RETRIED:
                    raise
                continue
            return
        await asyncio.sleep(0.02)


async def _takeover_trials(
    endpoints: BenchEndpoints, log_dir: Path, security: SecuritySettings, trials: int
) -> tuple[list[float], list[float]]:
    """Seconds from the master's end to the first accepted write: SIGKILL, then SIGTERM.

    A killed master's lease has to expire (``lease_s``); one stopped with SIGTERM releases
    it, so a follower takes over at its next election attempt — the in-run baseline.
    """
    url = await database(endpoints)
    replicas = [Replica(url, endpoints, i, log_dir, security) for i in range(3)]
    for replica in replicas:
        replica.start()
    channels = {r.address: admin_channel(r.address, security) for r in replicas}
    times: dict[str, list[float]] = {"SIGKILL": [], "SIGTERM": []}
    try:
        leader = await elected_leader(channels, replicas=replicas)
        await grant(borgmaster_pb2_grpc.BorgmasterStub(channels[leader]))
        for how in ("SIGKILL", "SIGTERM"):
            for trial in range(trials):
                leader = await elected_leader(channels)
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
    endpoints: BenchEndpoints, log_dir: Path, security: SecuritySettings, size: Size
) -> tuple[float, float]:
    url = await database(endpoints)
    master = polling_master(url, endpoints, security, poll_timeout_s=30)
    await master.start()
    fleet_address = f"127.0.0.1:{free_port()}"
    env = {
        **os.environ,
        "CELLPILOT_STACK_ENV": str(log_dir / "none.env"),
        "CELLPILOT_LOG_LEVEL": "WARNING",
        # The stack's Borglet certificate, whatever identity this process's environment names
        # (a test session exports its own): borglet-r0 covers the fleet's machine-r0-* names.
        "CELLPILOT_BORGLET_IDENTITY": "borglet-r0",
        "CELLPILOT_BORGLET_FLEET_SIZE": str(size.machines),
        "CELLPILOT_BORGLET_LISTEN_ADDRESS": fleet_address,
        "CELLPILOT_BORGLET_BORGMASTER_ADDRESSES": master.address,
        "CELLPILOT_BORGLET_PUBLISH_SAMPLES": "false",
        "CELLPILOT_BORGLET_CGROUP_ROOT": "none",
        **tls_env(security),
    }
    scheduler = SchedulerProcess(url, endpoints, [master.address], log_dir, security)
    scheduler.start()  # places the tasks the cycles poll (Borg §3.4: beside the master)
    fleet = _start_fleet(env, log_dir)
    # The Polls of the raw fan-out are made as the Borgmaster makes them (its certificate).
    channel = grpc.aio.secure_channel(fleet_address, security.channel_credentials("borgmaster"))
    try:
        replica = master.replica
        deadline = time.monotonic() + 120
        while not (replica.is_leader and len(replica.state.machines) == size.machines):
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(replica.state.machines)} machines registered")
            await asyncio.sleep(0.2)
        async with admin_channel(master.address, security) as master_channel:
            stub = borgmaster_pb2_grpc.BorgmasterStub(master_channel)
            await grant(stub)
            per_job = min(TASKS_PER_FLEET_JOB, size.tasks)
            for j in range(size.tasks // per_job):
                await stub.SubmitJob(
                    borgmaster_pb2.SubmitJobRequest(request_id=f"fleet-{j}", spec=job_spec(f"f{j}", per_job))
                )
        deadline = time.monotonic() + 180
        while (running := sum(1 for _, t in replica.state.iter_tasks() if t.started)) < size.tasks:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {running} of {size.tasks} tasks reported running")
            await master.poller.cycle(sorted(replica.state.machines))
        machines = sorted(replica.state.machines)
        cycles = []
        for _ in range(3):
            cycles.append((await master.poller.cycle(machines)).seconds)
        borglet = borglet_pb2_grpc.BorgletStub(channel)
        gate = asyncio.Semaphore(master.settings.poll_concurrency)

        async def poll(batch: list[str]) -> Any:
            async with gate:
                polls = [borglet_pb2.PollRequest(machine_id=m, master_epoch=replica.epoch) for m in batch]
                return await borglet.PollMachines(borglet_pb2.PollMachinesRequest(polls=polls), timeout=30)

        # The same transport as the cycle: the fleet's machines in PollMachines batches.
        batch = master.settings.poll_batch_max
        batches = [machines[i : i + batch] for i in range(0, len(machines), batch)]
        raw = []
        for _ in range(3):
            started = time.perf_counter()
            await asyncio.gather(*(poll(b) for b in batches))
            raw.append(time.perf_counter() - started)
        return statistics.median(cycles), statistics.median(raw)
    finally:
        await channel.close()
        scheduler.stop()
        await master.stop()
        fleet.send_signal(signal.SIGTERM)
        try:
            fleet.wait(timeout=30)
        except subprocess.TimeoutExpired:
            fleet.kill()


def run(report: Report, size: str = FULL) -> None:
    params = sized(SIZES, size)
    with embedded_stack("bench-borgmaster-") as (stack, base):
        endpoints = BenchEndpoints.of(stack, stack.endpoints)
        raw = asyncio.run(_raw_append_rate(endpoints, params.raw_appends))
        security = SecuritySettings(tls_mode="mtls", certs_dir=stack.config.certs_dir)
        one_txn = asyncio.run(_submit_rate(endpoints, base, security, params, batch_max=1))
        submitted = asyncio.run(_submit_rate(endpoints, base, security, params))
        where = f"gRPC SubmitJob, {params.in_flight} in flight, log in PostgreSQL"
        report("borgmaster.submit_jobs_per_s", submitted, f"jobs/s ({where}, group commit)")
        report(
            "borgmaster.submit_one_txn_per_request_jobs_per_s",
            one_txn,
            f"jobs/s ({where}, commit_batch_max=1)",
        )
        report("borgmaster.submit_group_commit_vs_one_txn", submitted / one_txn, "x")
        report("borgmaster.raw_append_records_per_s", raw, "records/s (CheckpointLog.append, same records)")
        report("borgmaster.submit_vs_raw_append", submitted / raw, "x")
        killed, stopped = asyncio.run(_takeover_trials(endpoints, base, security, params.trials))
        failover, handover = statistics.mean(killed), statistics.mean(stopped)
        report("borgmaster.failover_s", failover, "s (SIGKILL master -> first accepted write; Borg ~10 s)")
        report("borgmaster.graceful_handover_s", handover, "s (master SIGTERM, lease released -> write)")
        report("borgmaster.failover_vs_graceful_handover", failover / handover, "x")
        cycle, fanout = asyncio.run(_poll_cycle(endpoints, base, security, params))
        where = f"{params.machines} machines in one Borglet fleet-mode process, {params.tasks} tasks"
        report("borgmaster.poll_cycle_1000_machines_s", cycle, f"s ({where}: poll, diff, commit)")
        report("borgmaster.raw_poll_fanout_1000_machines_s", fanout, f"s ({where}: the polls alone)")
        report("borgmaster.poll_cycle_vs_raw_fanout", cycle / fanout, "x")
