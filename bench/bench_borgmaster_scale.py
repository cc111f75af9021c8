"""The Borgmaster at 10 000 machines: link-shard polling, and a whole cell with a failover.

* ``poll_cycle_10000_machines_s``: two Borglet processes in fleet mode simulate 10 000
  machines (5 000 each, 2 running tasks per machine); three Borgmaster replica processes each
  poll their link shard's share (Borg §3.3) and forward only the changed reports to the master.
  The figure is the slowest shard's cycle (poll its share, digest, forward, the master apply),
  in steady state, all three polling at once: the median over samples of the largest last
  cycle the master's ``GetLinkShards`` reports. Baseline in the same run:
  ``poll_cycle_10000_machines_single_master_s``, one master polling all 10 000 machines
  itself over the same transport (batched polls to the fleet endpoints) and diffing every
  report (median of 3 cycles); ``poll_cycle_10000_machines_ratio`` = single / sharded. For
  the record, ``poll_cycle_10000_machines_single_master_unbatched_s``: one cycle of the single
  master with one Poll RPC per machine (``poll_batch_max = 1``), as real machines are polled.
* ``cell10k.*``: three replica processes, fleets of 10 000 machines, 100 000 tasks submitted
  as 10 000 jobs of 10 through gRPC (64 in flight, each job retried with its request id on
  whichever replica answers); the master is SIGKILLed once half the jobs are acknowledged.
  ``time_to_all_scheduled_s``: first submission to every task placed (the master's
  ``GetCellStatus.tasks_running``); ``failover_gap_s``: the kill to the next acknowledged
  write; ``acknowledged_writes_lost``: acknowledged jobs missing from the new master's
  ``ListJobs`` (must be 0: the benchmark fails otherwise); ``master_rss_mib``: the resident
  memory of the master process holding the whole cell at the end.
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
from pathlib import Path
from typing import Any

import grpc
import psutil

from bench.borgmaster_processes import (
    BenchEndpoints,
    Replica,
    admin_channel,
    database,
    elected_leader,
    grant,
    job_spec,
    polling_master,
    tls_env,
)
from bench.harness import Report
from cellpilot.api.v1 import borgmaster_pb2, borgmaster_pb2_grpc, link_shard_pb2, link_shard_pb2_grpc
from cellpilot.security.tls import SecuritySettings
from cellpilot.stack import Stack, StackConfig
from cellpilot.stack.config import free_port

FIGURES = [
    "borgmaster.poll_cycle_10000_machines_s",
    "borgmaster.poll_cycle_10000_machines_single_master_s",
    "borgmaster.poll_cycle_10000_machines_ratio",
    "borgmaster.poll_cycle_10000_machines_single_master_unbatched_s",
    "borgmaster.cell10k.time_to_all_scheduled_s",
    "borgmaster.cell10k.failover_gap_s",
    "borgmaster.cell10k.acknowledged_writes_lost",
    "borgmaster.cell10k.master_rss_mib",
]
MACHINES = 10_000
FLEETS = 2
POLL_TASKS = 20_000  # 2 per machine
CELL_JOBS = 10_000
TASKS_PER_JOB = 10
IN_FLIGHT = 64
REPLICAS = 3


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


async def _machines(stub: borgmaster_pb2_grpc.BorgmasterStub) -> int:
    count, token = 0, ""
    while True:
        page = await stub.ListMachines(
            borgmaster_pb2.ListMachinesRequest(page_size=5_000, page_token=token), timeout=30
        )
        count += len(page.machines)
        token = page.next_page_token
        if not token:
            return count


async def _until(what: str, check: object, within: float, every: float = 1.0) -> None:
    deadline = time.monotonic() + within
    while True:
        done, progress = await check()  # type: ignore[operator]
        if done:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {within:.0f} s ({progress})")
        await asyncio.sleep(every)


async def _submit_all(stub: borgmaster_pb2_grpc.BorgmasterStub, jobs: int, tasks: int, label: str) -> None:
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def submit(j: int) -> None:
        async with gate:
            name = f"{label}-{j}"
            await stub.SubmitJob(
                borgmaster_pb2.SubmitJobRequest(request_id=name, spec=job_spec(name, tasks)), timeout=60
            )

    await asyncio.gather(*(submit(j) for j in range(jobs)))


async def _tasks_running(stub: borgmaster_pb2_grpc.BorgmasterStub) -> int:
    status = await stub.GetCellStatus(borgmaster_pb2.GetCellStatusRequest(), timeout=30)
    return int(status.tasks_running)


# ---------------------------------------------------------------------- poll cycle
async def _single_master_cycle(master: Any, security: SecuritySettings) -> tuple[float, float]:
    """One master polls the whole fleet itself (after the fleet registered and its tasks run)."""
    replica = master.replica

    async def registered() -> tuple[bool, str]:
        n = len(replica.state.machines)
        return replica.is_leader and n == MACHINES, f"{n} machines registered"

    await _until("fleet registration", registered, within=600)
    async with admin_channel(master.address, security) as channel:
        stub = borgmaster_pb2_grpc.BorgmasterStub(channel)
        await grant(stub)
        await _submit_all(stub, POLL_TASKS // 40, 40, "poll")
    machines = sorted(replica.state.machines)
    batch = master.settings.poll_batch_max

    async def started() -> tuple[bool, str]:
        await master.poller.cycle(machines)
        running = sum(1 for _, t in replica.state.iter_tasks() if t.started)
        return running >= POLL_TASKS, f"{running} of {POLL_TASKS} tasks reported running"

    await _until("tasks started", started, within=600, every=0.0)
    cycles = []
    for _ in range(3):
        cycles.append((await master.poller.cycle(machines)).seconds)
        print(f"  single master: a cycle of {MACHINES} machines took {cycles[-1]:.2f} s", flush=True)
    # For the record, what batching the fleet endpoints' polls is worth: one cycle of one Poll
    # RPC per machine, as a cell of real machines is polled.
    master.settings.poll_batch_max = 1
    unbatched = (await master.poller.cycle(machines)).seconds
    master.settings.poll_batch_max = batch
    return statistics.median(cycles), unbatched


async def _sharded_cycle(
    url: str, endpoints: BenchEndpoints, security: SecuritySettings, log_dir: Path
) -> float:
    env = {"CELLPILOT_BORGMASTER_POLL_INTERVAL_S": "0.5", "CELLPILOT_BORGMASTER_POLL_TIMEOUT_S": "30"}
    replicas = [Replica(url, endpoints, i, log_dir, security, **env) for i in range(REPLICAS)]
    for replica in replicas:
        replica.start()
    channels = {r.address: admin_channel(r.address, security) for r in replicas}
    try:
        leader = await elected_leader(channels, within=180, replicas=replicas)
        shards = link_shard_pb2_grpc.LinkShardsStub(channels[leader])

        async def steady() -> tuple[bool, str]:
            status = await shards.GetLinkShards(link_shard_pb2.GetLinkShardsRequest(), timeout=30)
            ok = len(status.shards) == REPLICAS and all(s.cycles >= 5 for s in status.shards)
            return ok, ", ".join(f"{s.replica_id}: {s.cycles} cycles" for s in status.shards)

        await _until("three link shards in steady state", steady, within=300)
        samples = []
        first = await shards.GetLinkShards(link_shard_pb2.GetLinkShardsRequest(), timeout=30)
        for _ in range(12):
            await asyncio.sleep(1.0)
            status = await shards.GetLinkShards(link_shard_pb2.GetLinkShardsRequest(), timeout=30)
            assert sum(s.machines for s in status.shards) == MACHINES, status
            samples.append(max(s.last_cycle_s for s in status.shards))
        shares = ", ".join(f"{s.replica_id}: {s.machines} machines" for s in status.shards)
        print(
            f"  link shards: {shares}; slowest cycle per sample {[round(x, 2) for x in samples]}", flush=True
        )
        # What reached the master: the reports forwarded per machine polled over the samples.
        before = {s.replica_id: s for s in first.shards}
        forwarded = sum(s.changed_reports - before[s.replica_id].changed_reports for s in status.shards)
        polled = sum(s.machines * (s.cycles - before[s.replica_id].cycles) for s in status.shards)
        print(f"  forwarded to the master: {forwarded} of {polled} machine reports polled", flush=True)
        return statistics.median(samples)
    finally:
        for channel in channels.values():
            await channel.close()
        for replica in replicas:
            replica.stop()


async def _poll_cycles(
    endpoints: BenchEndpoints, security: SecuritySettings, log_dir: Path
) -> tuple[float, float, float]:
    """(single master, single master unbatched, sharded) over the same fleet and database."""
    url = await database(endpoints)
    master = polling_master(url, endpoints, security, poll_timeout_s=60)
    await master.start()
    fleets = Fleets(MACHINES, [master.address], log_dir, security)
    try:
        try:
            single, unbatched = await _single_master_cycle(master, security)
        finally:
            await master.stop()  # releases the lease: a replica process takes over at once
        return single, unbatched, await _sharded_cycle(url, endpoints, security, log_dir)
    finally:
        fleets.stop()


# ---------------------------------------------------------------------- a whole cell
RETRIED = (
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
)


class CellRun:
    """Submits the cell's jobs through whichever replica answers; kills the master halfway."""

    def __init__(self, replicas: list[Replica], channels: dict[str, grpc.aio.Channel], leader: str) -> None:
        self.replicas = replicas
        self.channels = channels
        self.leader = leader
        self.acked: set[str] = set()
        self.victim: Replica | None = None
        self.killed_at = 0.0
        self.first_ack_after_kill = 0.0

    def _kill_master(self) -> None:
        self.victim = next(r for r in self.replicas if r.address == self.leader)
        assert self.victim.process is not None
        self.victim.process.send_signal(signal.SIGKILL)
        self.killed_at = time.monotonic()
        print(f"  SIGKILL the master {self.leader} after {len(self.acked)} acknowledged jobs", flush=True)

    def _next_address(self, failed: str) -> str:
        alive = [a for a in self.channels if self.victim is None or a != self.victim.address]
        return alive[(alive.index(failed) + 1) % len(alive)] if failed in alive else alive[0]

    async def submit(self, name: str, tasks: int) -> None:
        request = borgmaster_pb2.SubmitJobRequest(request_id=name, spec=job_spec(name, tasks))
        while True:
            address = self.leader
            try:
                await borgmaster_pb2_grpc.BorgmasterStub(self.channels[address]).SubmitJob(
                    request, timeout=15
                )
            except grpc.aio.AioRpcError as error:
                if error.code() not in RETRIED:
                    raise
                if self.leader == address:
                    self.leader = self._next_address(address)
                await asyncio.sleep(0.05)
                continue
            self.acked.add(name)
            # The gap ends with a write the new master accepted (answers the dead one sent
            # before it died may still arrive after the kill).
            victim = self.victim.address if self.victim else ""
            if self.killed_at and not self.first_ack_after_kill and address != victim:
                self.first_ack_after_kill = time.monotonic()
            if not self.killed_at and len(self.acked) >= CELL_JOBS // 2:
                self._kill_master()
            return


async def _job_ids(stub: borgmaster_pb2_grpc.BorgmasterStub) -> set[str]:
    ids: set[str] = set()
    token = ""
    while True:
        page = await stub.ListJobs(
            borgmaster_pb2.ListJobsRequest(page_size=5_000, page_token=token), timeout=60
        )
        ids.update(job.job_id for job in page.jobs)
        token = page.next_page_token
        if not token:
            return ids


async def _cell10k(endpoints: BenchEndpoints, security: SecuritySettings, log_dir: Path) -> dict[str, float]:
    url = await database(endpoints)
    replicas = [Replica(url, endpoints, i, log_dir, security) for i in range(REPLICAS)]
    for replica in replicas:
        replica.start()
    channels = {r.address: admin_channel(r.address, security) for r in replicas}
    fleets = Fleets(MACHINES, list(channels), log_dir, security)
    try:
        leader = await elected_leader(channels, within=180, replicas=replicas)
        stub = borgmaster_pb2_grpc.BorgmasterStub(channels[leader])
        await grant(stub)

        async def registered() -> tuple[bool, str]:
            n = await _machines(stub)
            return n == MACHINES, f"{n} machines registered"

        await _until("fleet registration", registered, within=900, every=2.0)
        run = CellRun(replicas, channels, leader)
        gate = asyncio.Semaphore(IN_FLIGHT)

        async def submit(j: int) -> None:
            async with gate:
                await run.submit(f"cell-{j}", TASKS_PER_JOB)

        started = time.monotonic()
        await asyncio.gather(*(submit(j) for j in range(CELL_JOBS)))
        submitted_s = time.monotonic() - started
        print(f"  {CELL_JOBS} jobs acknowledged in {submitted_s:.1f} s", flush=True)
        new_leader = await elected_leader(channels, within=60)
        stub = borgmaster_pb2_grpc.BorgmasterStub(channels[new_leader])
        total = CELL_JOBS * TASKS_PER_JOB

        async def scheduled() -> tuple[bool, str]:
            n = await _tasks_running(stub)
            return n >= total, f"{n} of {total} tasks placed"

        await _until("all tasks scheduled", scheduled, within=1800, every=0.5)
        time_to_all = time.monotonic() - started
        present = await _job_ids(stub)
        lost = sorted(name for name in run.acked if f"bench/{name}" not in present)
        master = next(r for r in replicas if r.address == new_leader)
        assert master.process is not None
        rss = psutil.Process(master.process.pid).memory_info().rss / (1 << 20)
        if lost:
            raise AssertionError(f"{len(lost)} acknowledged jobs lost across the failover, e.g. {lost[:5]}")
        return {
            "time_to_all_scheduled_s": time_to_all,
            "failover_gap_s": run.first_ack_after_kill - run.killed_at,
            "acknowledged_writes_lost": float(len(lost)),
            "master_rss_mib": rss,
        }
    finally:
        for channel in channels.values():
            await channel.close()
        for replica in replicas:
            replica.stop()
        fleets.stop()


def run(report: Report) -> None:
    wants = getattr(report, "wants", lambda _names: True)
    with tempfile.TemporaryDirectory(prefix="bench-borgmaster-scale-") as tmp:
        base = Path(tmp)
        stack = Stack(StackConfig(base / "stack"))
        endpoints = BenchEndpoints.of(stack, stack.up())
        try:
            security = SecuritySettings(tls_mode="mtls", certs_dir=stack.config.certs_dir)
            if wants(FIGURES[:4]):
                single, unbatched, sharded = asyncio.run(_poll_cycles(endpoints, security, base))
                where = f"{MACHINES} machines in {FLEETS} fleet-mode Borglets, {POLL_TASKS} tasks"
                report(FIGURES[0], sharded, f"s ({where}; {REPLICAS} link shards)")
                report(FIGURES[1], single, f"s ({where}; the master polls all)")
                report(FIGURES[2], single / sharded, "x (single / sharded)")
                report(FIGURES[3], unbatched, f"s ({where}; the master polls all, one Poll RPC each)")
            if wants(FIGURES[4:]):
                cell = asyncio.run(_cell10k(endpoints, security, base))
                what = f"{REPLICAS} replicas, {MACHINES} machines, {CELL_JOBS * TASKS_PER_JOB} tasks"
                units = {
                    "time_to_all_scheduled_s": f"s ({what}: first submission -> every task placed)",
                    "failover_gap_s": "s (SIGKILL of the master -> the next acknowledged write)",
                    "acknowledged_writes_lost": "jobs (must be 0)",
                    "master_rss_mib": "MiB (the master's resident memory at the end)",
                }
                for key, unit in units.items():
                    report(f"borgmaster.cell10k.{key}", cell[key], unit)
        finally:
            stack.down()
