"""The Borgmaster at 10 000 machines: link-shard polling.

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
  The samples follow whichever replica is the master, as a client does; a sample is taken
  only while the same master (epoch) holds and its three shards have each reported a full
  cycle to it. ``poll_cycle_10000_machines_master_changes`` counts the new masters elected
  while the shards were measured: 0 on a healthy run (a master that loses its lease under
  this load is a finding, reported here rather than crashing the benchmark).

The whole cell at this scale (``borgmaster.cell10k.*``) is :mod:`bench.bench_borgmaster_cell`.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from bench.borgmaster_processes import (
    FLEETS,
    REPLICAS,
    BenchEndpoints,
    Fleets,
    Master,
    Replica,
    SchedulerProcess,
    admin_channel,
    database,
    grant,
    job_spec,
    polling_master,
    stop_all,
    until,
)
from bench.harness import FULL, SMOKE, Report, embedded_stack, sized
from cellpilot.api.v1 import borgmaster_pb2, borgmaster_pb2_grpc, link_shard_pb2
from cellpilot.security.tls import SecuritySettings

FIGURES = [
    "borgmaster.poll_cycle_10000_machines_s",
    "borgmaster.poll_cycle_10000_machines_single_master_s",
    "borgmaster.poll_cycle_10000_machines_ratio",
    "borgmaster.poll_cycle_10000_machines_single_master_unbatched_s",
    "borgmaster.poll_cycle_10000_machines_master_changes",
]
TASKS_PER_POLL_JOB = 40


@dataclass(frozen=True)
class Size:
    machines: int
    poll_tasks: int  # 2 per machine
    in_flight: int
    steady_cycles: int  # full cycles each shard reports before the samples
    samples: int  # of the shards' cycles, one a second


SIZES = {
    FULL: Size(
        machines=10_000,
        poll_tasks=20_000,
        in_flight=64,
        steady_cycles=5,
        samples=12,
    ),
    SMOKE: Size(machines=40, poll_tasks=80, in_flight=8, steady_cycles=1, samples=2),
}


async def _submit_all(
    stub: borgmaster_pb2_grpc.BorgmasterStub, jobs: int, tasks: int, label: str, in_flight: int
) -> None:
    gate = asyncio.Semaphore(in_flight)

    async def submit(j: int) -> None:
        async with gate:
            name = f"{label}-{j}"
            await stub.SubmitJob(
                borgmaster_pb2.SubmitJobRequest(request_id=name, spec=job_spec(name, tasks)), timeout=60
            )

    await asyncio.gather(*(submit(j) for j in range(jobs)))


# ---------------------------------------------------------------------- poll cycle
async def _single_master_cycle(master: Any, security: SecuritySettings, size: Size) -> tuple[float, float]:
    """One master polls the whole fleet itself (after the fleet registered and its tasks run)."""
    replica = master.replica

    async def registered() -> tuple[bool, str]:
        n = len(replica.state.machines)
        return replica.is_leader and n == size.machines, f"{n} machines registered"

    await until("fleet registration", registered, within=600)
    per_job = min(TASKS_PER_POLL_JOB, size.poll_tasks)
    async with admin_channel(master.address, security) as channel:
        stub = borgmaster_pb2_grpc.BorgmasterStub(channel)
        await grant(stub)
        await _submit_all(stub, size.poll_tasks // per_job, per_job, "poll", size.in_flight)
    machines = sorted(replica.state.machines)
    batch = master.settings.poll_batch_max

    async def started() -> tuple[bool, str]:
        await master.poller.cycle(machines)
        running = sum(1 for _, t in replica.state.iter_tasks() if t.started)
        return running >= size.poll_tasks, f"{running} of {size.poll_tasks} tasks reported running"

    await until("tasks started", started, within=600, every=0.0)
    cycles = []
    for _ in range(3):
        cycles.append((await master.poller.cycle(machines)).seconds)
        print(f"  single master: a cycle of {size.machines} machines took {cycles[-1]:.2f} s", flush=True)
    # For the record, what batching the fleet endpoints' polls is worth: one cycle of one Poll
    # RPC per machine, as a cell of real machines is polled.
    master.settings.poll_batch_max = 1
    unbatched = (await master.poller.cycle(machines)).seconds
    master.settings.poll_batch_max = batch
    return statistics.median(cycles), unbatched


async def _sharded_cycle(
    url: str, endpoints: BenchEndpoints, security: SecuritySettings, log_dir: Path, size: Size
) -> tuple[float, int]:
    """(the median of the slowest shard's cycle over the samples, new masters meanwhile)."""
    env = {"CELLPILOT_BORGMASTER_POLL_INTERVAL_S": "0.5", "CELLPILOT_BORGMASTER_POLL_TIMEOUT_S": "30"}
    replicas = [Replica(url, endpoints, i, log_dir, security, **env) for i in range(REPLICAS)]
    channels: dict[str, grpc.aio.Channel] = {}
    try:
        for replica in replicas:
            replica.start()
        channels.update({r.address: admin_channel(r.address, security) for r in replicas})
        master = Master(channels, replicas)

        def settled(status: link_shard_pb2.GetLinkShardsResponse, cycles: int) -> bool:
            return (
                len(status.shards) == REPLICAS
                and all(s.cycles >= cycles for s in status.shards)
                and sum(s.machines for s in status.shards) == size.machines
            )

        async def steady() -> tuple[bool, str]:
            status = await master.link_shards()
            progress = ", ".join(f"{s.replica_id}: {s.cycles} cycles" for s in status.shards)
            return settled(status, size.steady_cycles), progress

        try:
            await until("three link shards in steady state", steady, within=300)
        except TimeoutError as error:  # measured all the same, and the masters lost are reported
            print(f"  no steady state: {error}; {len(master.epochs) - 1} new masters so far", flush=True)
        measured_from = len(master.epochs) - 1
        samples: list[float] = []
        first = status = await master.link_shards()
        deadline = time.monotonic() + 30 * size.samples
        while len(samples) < size.samples and time.monotonic() < deadline:
            await asyncio.sleep(1.0)
            status = await master.link_shards()
            if status.master_epoch != first.master_epoch:
                first = status  # the counters are the new master's: start them again
            if settled(status, 1):
                samples.append(max(s.last_cycle_s for s in status.shards))
        changes = len(master.epochs) - 1 - measured_from
        if not samples:
            print(
                f"  not measured: in {30 * size.samples} s no master kept its lease until each of its "
                f"{REPLICAS} shards had reported a full cycle ({changes} new masters)",
                flush=True,
            )
            return math.nan, changes
        shares = ", ".join(f"{s.replica_id}: {s.machines} machines" for s in status.shards)
        print(
            f"  link shards: {shares}; slowest cycle per sample {[round(x, 2) for x in samples]}", flush=True
        )
        # What reached the master: the reports forwarded per machine polled over the samples.
        before = {s.replica_id: s for s in first.shards}
        forwarded = sum(
            s.changed_reports - before[s.replica_id].changed_reports
            for s in status.shards
            if s.replica_id in before
        )
        polled = sum(
            s.machines * (s.cycles - before[s.replica_id].cycles)
            for s in status.shards
            if s.replica_id in before
        )
        print(f"  forwarded to the master: {forwarded} of {polled} machine reports polled", flush=True)
        return statistics.median(samples), changes
    finally:
        for channel in channels.values():
            await channel.close()
        stop_all(replicas)


async def _poll_cycles(
    endpoints: BenchEndpoints, security: SecuritySettings, log_dir: Path, size: Size
) -> tuple[float, float, float, int]:
    """(single master, single master unbatched, sharded, new masters while sharded) over the
    same fleet and database."""
    url = await database(endpoints)
    master = polling_master(url, endpoints, security, poll_timeout_s=60)
    await master.start()
    fleets: Fleets | None = None
    scheduler = SchedulerProcess(url, endpoints, [master.address], log_dir, security)
    try:
        try:
            scheduler.start()  # places the tasks the cycles poll (Borg §3.4: beside the master)
            fleets = Fleets(size.machines, [master.address], log_dir, security)
            single, unbatched = await _single_master_cycle(master, security, size)
        finally:
            scheduler.stop()
            await master.stop()  # releases the lease: a replica process takes over at once
        sharded, changes = await _sharded_cycle(url, endpoints, security, log_dir, size)
        return single, unbatched, sharded, changes
    finally:
        if fleets is not None:
            fleets.stop()


def run(report: Report, size: str = FULL) -> None:
    params = sized(SIZES, size)
    with embedded_stack("bench-borgmaster-scale-") as (stack, base):
        endpoints = BenchEndpoints.of(stack, stack.endpoints)
        security = SecuritySettings(tls_mode="mtls", certs_dir=stack.config.certs_dir)
        single, unbatched, sharded, changes = asyncio.run(_poll_cycles(endpoints, security, base, params))
        where = f"{params.machines} machines in {FLEETS} fleet-mode Borglets, {params.poll_tasks} tasks"
        report(FIGURES[0], sharded, f"s ({where}; {REPLICAS} link shards)")
        report(FIGURES[1], single, f"s ({where}; the master polls all)")
        report(FIGURES[2], single / sharded, "x (single / sharded)")
        report(FIGURES[3], unbatched, f"s ({where}; the master polls all, one Poll RPC each)")
        report(FIGURES[4], changes, "new masters while the shards were measured (0: one master's term)")
