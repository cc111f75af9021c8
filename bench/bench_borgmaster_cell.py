"""A whole Borgmaster cell at 10 000 machines, its scheduler a process of its own (Borg §3.1, §3.4).

Three Borgmaster replica processes, two fleet-mode Borglets simulating 10 000 machines, and the
scheduler process beside the master (it follows the checkpoint log and proposes placements the
master commits or refuses as stale), as ``cellpilot run`` runs them. One run, two phases:

* ``cell10k.*``: 100 000 tasks submitted as 10 000 jobs of 10 through gRPC (64 in flight, each
  job retried with its request id on the master a refusal names, else the next replica). The
  master is SIGKILLed once half the jobs are acknowledged, the scheduler process once half the
  tasks are placed (a new one started at once, and one more job of one task submitted, so that
  there is always a placement left to make). ``time_to_all_scheduled_s``: first submission to
  every task placed (the master's ``GetCellStatus.tasks_running``), both kills included;
  ``failover_gap_s``: the master's kill to the next acknowledged write;
  ``acknowledged_writes_lost``: acknowledged jobs missing from the new master's ``ListJobs``
  (must be 0: the benchmark fails otherwise); ``master_rss_mib``: the resident memory of the
  master holding the whole cell. ``vs_library_from_scratch``: time_to_all_scheduled_s / one
  pass of the scheduling library (:mod:`bench.bench_schedule`'s from-scratch figure) placing the
  same tasks on the same machines: the machines as the master lists them, each task's shape as
  the scheduler's copy builds it, the cell's scheduling policy; measured in the same run once
  the processes stopped (goal <= 2). The scheduler's kill: ``scheduler_kill_tasks_placed_twice``
  (must be 0): the most the master's ``tasks_running`` ever exceeded the tasks submitted (read
  every second), plus the machines' task counts (``ListMachines``) beyond the tasks ``GetJob``
  shows running (a task on two machines); tasks scheduled again after their machine went down
  (incarnation > 1) are printed, not counted. ``..._tasks_lost`` (must be 0): acknowledged tasks
  ``GetJob`` shows neither running nor pending (pending ones are printed with their reason). A
  follower answers these reads from its copy during an election: what it did not show is read
  again, for up to ``SETTLE_S``. ``..._resume_s``: the kill to the master's next accepted placement
  (``placements_accepted`` growing past its count once the killed process was reaped).
* ``online_placements_per_s``: then, once nothing is pending (tasks whose machines went down were
  placed again), on the loaded cell 20 000 tasks arrive in jobs of 10, each
  job submitted after a random running job of the cell is killed, as :mod:`bench.bench_schedule`'s
  online stream does: the arriving tasks / (first write -> every one of them running in
  ``GetCellStatus``: nothing pending, the running count back where it was; nan when that takes
  over ``ONLINE_WITHIN_S``, the other figures reported all the same). ``online_vs_library``:
  that / the library's online placements/s with ``bench_schedule.online_stream`` of the same
  arrivals on the same loaded cell (the library's from-scratch placements replayed), best of two
  (goal >= 0.5).
* ``scheduler_stale_fraction``: placements the master refused as stale / placements proposed
  (accepted + stale) over both phases, summed over the masters; each master counts from its
  election, and the last second of the killed master's counts is missed. (``GetCellStatus.
  proposals`` counts proposal batches.)
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import psutil

from bench.bench_schedule import new_cell, online_stream, replay
from bench.borgmaster_processes import (
    REPLICAS,
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
    stop_all,
    until,
)
from bench.harness import FULL, SMOKE, Report, embedded_stack, sized
from cellpilot.api.v1 import borgmaster_pb2, borgmaster_pb2_grpc, machine_pb2, state_pb2
from cellpilot.borg.lifetime_tracker import LifetimeTracker
from cellpilot.borg.scheduling_view import schedule_machine, task_shape
from cellpilot.borg_wire.specs import job_spec_in, machine_spec_in
from cellpilot.client.failover import leader_hint
from cellpilot.schedule import PlacementTask, Scheduler
from cellpilot.security.tls import SecuritySettings
from cellpilot_services.borgmaster.settings import BorgmasterSettings

FIGURES = [
    "borgmaster.cell10k.time_to_all_scheduled_s",
    "borgmaster.cell10k.failover_gap_s",
    "borgmaster.cell10k.acknowledged_writes_lost",
    "borgmaster.cell10k.master_rss_mib",
    "borgmaster.cell10k.vs_library_from_scratch",
    "borgmaster.cell10k.scheduler_kill_tasks_placed_twice",
    "borgmaster.cell10k.scheduler_kill_tasks_lost",
    "borgmaster.cell10k.scheduler_kill_resume_s",
    "borgmaster.online_placements_per_s",
    "borgmaster.online_vs_library",
    "borgmaster.scheduler_stale_fraction",
]
USER = "bench"
PROBE = "probe-after-scheduler-kill"  # the one-task job submitted after the scheduler's kill
# How often the master's GetCellStatus is read: each read sorts the cell's pending tasks on the
# master's event loop (tens of ms at 100 000), so the benchmark reads it sparingly, and a little
# more often only while it times something.
POLL_S, FINE_POLL_S = 1.0, 0.25
# How long the checks read again what a follower's lagging copy answered during an election.
SETTLE_S = 300.0
ONLINE_WITHIN_S = 1200.0


@dataclass(frozen=True)
class Size:
    machines: int
    cell_jobs: int
    tasks_per_job: int
    in_flight: int
    online_jobs: int


SIZES = {
    FULL: Size(machines=10_000, cell_jobs=10_000, tasks_per_job=10, in_flight=64, online_jobs=2_000),
    SMOKE: Size(machines=40, cell_jobs=40, tasks_per_job=2, in_flight=8, online_jobs=10),
}


# ---------------------------------------------------------------------- writes
class Writes:
    """Writes to the master (following a refusal that names it, else trying the next replica,
    as the client does); kills the master once ``kill_master_after`` jobs are acknowledged."""

    def __init__(
        self,
        replicas: list[Replica],
        channels: dict[str, grpc.aio.Channel],
        leader: str,
        kill_master_after: int,
    ) -> None:
        self.replicas = replicas
        self.channels = channels
        self.leader = leader
        self.kill_master_after = kill_master_after
        self.acked: dict[str, int] = {}  # job name -> its tasks
        self.victim: Replica | None = None
        self.killed_at = 0.0
        self.first_ack_after_kill = 0.0

    def _kill_master(self) -> None:
        self.victim = next(r for r in self.replicas if r.address == self.leader)
        assert self.victim.process is not None
        self.victim.process.send_signal(signal.SIGKILL)
        self.killed_at = time.monotonic()
        print(f"  SIGKILL the master {self.leader} after {len(self.acked)} acknowledged jobs", flush=True)

    def _next_address(self, failed: str, named: str | None) -> str:
        alive = [a for a in self.channels if self.victim is None or a != self.victim.address]
        if named in alive:
            return named
        return alive[(alive.index(failed) + 1) % len(alive)] if failed in alive else alive[0]

    async def _write(self, method: str, request: Any) -> None:
        while True:
            address = self.leader
            stub = borgmaster_pb2_grpc.BorgmasterStub(self.channels[address])
            try:
                await getattr(stub, method)(request, timeout=15)
            except grpc.aio.AioRpcError as error:
                if error.code() not in RETRIED:
                    raise
                if self.leader == address:
                    self.leader = self._next_address(address, leader_hint(error))
                await asyncio.sleep(0.05)
                continue
            # The gap ends with a write the new master accepted (answers the dead one sent
            # before it died may still arrive after the kill).
            victim = self.victim.address if self.victim else ""
            if self.killed_at and not self.first_ack_after_kill and address != victim:
                self.first_ack_after_kill = time.monotonic()
            return

    async def submit(self, name: str, tasks: int) -> None:
        await self._write(
            "SubmitJob", borgmaster_pb2.SubmitJobRequest(request_id=name, spec=job_spec(name, tasks))
        )
        self.acked[name] = tasks
        if self.kill_master_after and not self.killed_at and len(self.acked) >= self.kill_master_after:
            self._kill_master()

    async def kill_job(self, name: str) -> None:
        await self._write(
            "KillJob", borgmaster_pb2.KillJobRequest(request_id=f"kill-{name}", job_id=f"{USER}/{name}")
        )


# ---------------------------------------------------------------------- the master's counts
class Watch:
    """Follows the master's ``GetCellStatus`` through the run: every master's proposal counts,
    how far ``tasks_running`` ever exceeded ``bound``; SIGKILLs the scheduler process once
    ``kill_scheduler_at`` tasks run, starts a new one and times the next accepted placement."""

    def __init__(
        self,
        master: Master,
        writes: Writes,
        new_scheduler: Callable[[], SchedulerProcess],
        kill_scheduler_at: int,
    ) -> None:
        self.master = master
        self.writes = writes
        self.new_scheduler = new_scheduler
        self.schedulers: list[SchedulerProcess] = [new_scheduler()]
        self.kill_scheduler_at = kill_scheduler_at
        self.bound = 0  # the most tasks that may run
        self.beyond_bound = 0
        self.counts: dict[str, tuple[int, int]] = {}  # replica -> (accepted, stale) this term
        self.banked = (0, 0)  # of the masters' earlier terms
        self.resume_s = float("nan")
        self.last: borgmaster_pb2.GetCellStatusResponse | None = None

    def start(self) -> None:
        self.schedulers[-1].start()

    async def status(self) -> borgmaster_pb2.GetCellStatusResponse:
        gone = self.schedulers[-1].exited()
        if gone:  # say so at once rather than when nothing was placed for half an hour
            raise RuntimeError(f"the scheduler process died: {gone}")
        s = await self.master.cell_status()
        accepted, stale = self.counts.get(s.replica_id, (0, 0))
        if s.placements_accepted < accepted or s.placements_stale < stale:  # a new term's counts
            self.banked = (self.banked[0] + accepted, self.banked[1] + stale)
        self.counts[s.replica_id] = (s.placements_accepted, s.placements_stale)
        self.beyond_bound = max(self.beyond_bound, s.tasks_running - self.bound)
        self.last = s
        return s

    def stale_fraction(self) -> tuple[float, int, int]:
        accepted = self.banked[0] + sum(a for a, _ in self.counts.values())
        stale = self.banked[1] + sum(s for _, s in self.counts.values())
        return stale / max(accepted + stale, 1), accepted, stale

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            s = await self.status()
            if self.kill_scheduler_at and s.tasks_running >= self.kill_scheduler_at:
                self.kill_scheduler_at = 0
                await self._kill_scheduler(s.tasks_running)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), POLL_S)

    async def _kill_scheduler(self, running: int) -> None:
        old = self.schedulers[-1]
        assert old.process is not None
        old.process.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        print(f"  SIGKILL the scheduler process with {running} tasks placed", flush=True)
        await asyncio.to_thread(old.process.wait)
        self.schedulers.append(self.new_scheduler())
        self.schedulers[-1].start()
        # The master's count once the killed process is gone, before the new one can have
        # proposed anything (it takes seconds to start).
        before = await self.status()
        await self.writes.submit(PROBE, 1)

        async def accepted() -> tuple[bool, str]:
            s = await self.status()
            since = before.placements_accepted if s.replica_id == before.replica_id else 0
            return s.placements_accepted > since, f"{s.placements_accepted - since} placements accepted"

        await until("a placement by the new scheduler", accepted, within=600, every=FINE_POLL_S)
        self.resume_s = time.monotonic() - killed_at
        print(
            f"  the new scheduler's first placement accepted {self.resume_s:.2f} s after the kill", flush=True
        )

    def stop(self) -> None:
        for scheduler in self.schedulers:
            scheduler.stop()


# ---------------------------------------------------------------------- checks
async def _missing_jobs(master: Master, names: list[str]) -> list[str]:
    """The acknowledged jobs ``ListJobs`` does not show, read again until none is missing or
    ``SETTLE_S`` passed (every replica answers it from its copy, which may lag the master's)."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        present = await master.job_ids()
        missing = sorted(name for name in names if f"{USER}/{name}" not in present)
        if not missing or time.monotonic() > deadline:
            return missing
        await asyncio.sleep(2.0)


@dataclass(frozen=True)
class Placements:
    """The cell's tasks as GetJob and ListMachines show them after the kills."""

    running: int
    on_machines_beyond_running: int  # the machines' task counts over the running tasks
    lost: int  # acknowledged tasks neither running nor pending (gone, or dead)
    pending: Counter[str]  # pending again, by the reason (e.g. LOST: its machine went down)
    rescheduled: int  # scheduled more than once (incarnation > 1), e.g. after their machine went down
    machines: list[machine_pb2.Machine]


async def _placements(master: Master, jobs: dict[str, int]) -> Placements:
    """The tasks of ``jobs`` (name -> tasks) as the master's GetJob and ListMachines show them.

    During an election a follower answers these from its copy, which may lag: a job whose tasks
    the answer does not all show is read again, and the machines until their task counts match
    the running tasks, until ``SETTLE_S`` passed. The caller reads them with the cell at rest:
    a task placed between the two reads would count on its machine but not as running."""
    gate = asyncio.Semaphore(32)
    seen: dict[str, state_pb2.JobStatus] = {}
    alive = (state_pb2.TASK_STATE_RUNNING, state_pb2.TASK_STATE_PENDING)

    async def read(name: str) -> None:
        async with gate:
            seen[name] = await master.job(f"{USER}/{name}")

    def count(name: str, states: tuple[int, ...]) -> int:
        return sum(1 for t in seen[name].tasks if t.state in states)

    deadline = time.monotonic() + SETTLE_S
    todo = list(jobs)
    while True:
        await asyncio.gather(*(read(name) for name in todo))
        todo = [name for name in todo if count(name, alive) < jobs[name]]
        if not todo or time.monotonic() > deadline:
            break
        print(f"  {len(todo)} jobs not all there in the copy that answered: read again", flush=True)
        await asyncio.sleep(2.0)
    tasks = [t for job in seen.values() for t in job.tasks]
    running = sum(1 for t in tasks if t.state == state_pb2.TASK_STATE_RUNNING)
    pending = Counter(
        state_pb2.TaskEventKind.Name(t.reason) for t in tasks if t.state == state_pb2.TASK_STATE_PENDING
    )
    while True:
        machines = await master.machines()
        beyond = sum(m.task_count for m in machines) - running
        if beyond <= 0 or time.monotonic() > deadline:
            break
        await asyncio.sleep(2.0)
    return Placements(
        running=running,
        on_machines_beyond_running=max(0, beyond),
        lost=sum(jobs.values()) - running - sum(pending.values()),
        pending=pending,
        rescheduled=sum(1 for t in tasks if t.incarnation > 1),
        machines=machines,
    )


async def _at_rest(watch: Watch, within: float) -> None:
    """Until nothing is pending (tasks LOST with a machine that missed its polls placed again)."""

    async def settled() -> tuple[bool, str]:
        s = await watch.status()
        return s.tasks_pending == 0, f"{s.tasks_pending} tasks pending, {s.tasks_running} running"

    await until("the loaded cell at rest", settled, within, POLL_S)


async def _online(master: Master, writes: Writes, watch: Watch, size: Size) -> float:
    """Placements/s of the arriving jobs, each submitted after a random job of the cell is killed;
    nan (and why, printed) if the cell did not settle within ``ONLINE_WITHIN_S``."""
    cell = sorted(name for name in writes.acked if name.startswith("cell-"))
    exits = [cell[i] for i in np.random.default_rng(3).permutation(len(cell))[: size.online_jobs]]
    try:  # a loaded cell at rest: tasks LOST with their machines (missed polls) placed again first
        await _at_rest(watch, ONLINE_WITHIN_S)
    except TimeoutError as error:
        print(f"  online placements not measured: {error}", flush=True)
        return math.nan
    before = await watch.status()
    watch.bound = before.tasks_running + size.online_jobs * size.tasks_per_job
    gate = asyncio.Semaphore(size.in_flight)
    written = 0

    async def arrive(k: int) -> None:
        nonlocal written
        async with gate:
            await writes.kill_job(exits[k])
            await writes.submit(f"online-{k}", size.tasks_per_job)
            written += 1

    started = time.monotonic()
    writing = asyncio.gather(*(arrive(k) for k in range(size.online_jobs)))

    async def placed() -> tuple[bool, str]:
        if writing.done():
            writing.result()  # a write's failure, at once
        s = await watch.status()
        done = writing.done() and s.tasks_pending == 0 and s.tasks_running >= before.tasks_running
        return done, f"{written} jobs written, {s.tasks_pending} tasks pending, {s.tasks_running} running"

    try:
        await until("online arrivals placed", placed, ONLINE_WITHIN_S, FINE_POLL_S)
    except TimeoutError as error:  # the first phase's figures are reported all the same
        print(f"  online placements not measured: {error}", flush=True)
        return math.nan
    finally:
        writing.cancel()  # nothing left to cancel once it is done
    seconds = time.monotonic() - started
    tasks = size.online_jobs * size.tasks_per_job
    print(f"  online: {tasks} tasks of {size.online_jobs} jobs placed in {seconds:.1f} s", flush=True)
    return tasks / seconds


# ---------------------------------------------------------------------- the run
async def _service(
    endpoints: BenchEndpoints, security: SecuritySettings, log_dir: Path, size: Size
) -> tuple[dict[str, float], list[machine_pb2.Machine]]:
    url = await database(endpoints)
    replicas = [Replica(url, endpoints, i, log_dir, security) for i in range(REPLICAS)]
    channels: dict[str, grpc.aio.Channel] = {}
    fleets: Fleets | None = None
    watch: Watch | None = None
    stop = asyncio.Event()
    try:
        for replica in replicas:
            replica.start()
        channels.update({r.address: admin_channel(r.address, security) for r in replicas})
        master = Master(channels, replicas)
        fleets = Fleets(size.machines, list(channels), log_dir, security)
        leader = await elected_leader(channels, within=180, replicas=replicas)
        await grant(borgmaster_pb2_grpc.BorgmasterStub(channels[leader]))
        total = size.cell_jobs * size.tasks_per_job
        writes = Writes(replicas, channels, leader, kill_master_after=size.cell_jobs // 2)
        watch = Watch(
            master,
            writes,
            lambda: SchedulerProcess(url, endpoints, list(channels), log_dir, security),
            kill_scheduler_at=total // 2,
        )
        watch.bound = total + 1
        watch.start()

        async def registered() -> tuple[bool, str]:
            n = len(await master.machines())
            return n == size.machines, f"{n} machines registered"

        await until("fleet registration", registered, within=900, every=2.0)
        writes.leader = await elected_leader(channels, within=60, replicas=replicas)
        gate = asyncio.Semaphore(size.in_flight)

        async def submit(j: int) -> None:
            async with gate:
                await writes.submit(f"cell-{j}", size.tasks_per_job)

        watching = asyncio.create_task(watch.run(stop))
        started = time.monotonic()
        await asyncio.gather(*(submit(j) for j in range(size.cell_jobs)))
        print(f"  {size.cell_jobs} jobs acknowledged in {time.monotonic() - started:.1f} s", flush=True)

        async def scheduled() -> tuple[bool, str]:
            if watching.done():
                watching.result()  # its failure, at once
            s = watch.last
            n = s.tasks_running if s is not None else 0
            done = n >= total + 1 and not math.isnan(watch.resume_s)
            return done, f"{n} of {total + 1} tasks placed"

        await until("all tasks scheduled", scheduled, within=1800, every=0.1)
        time_to_all = time.monotonic() - started
        print(f"  every task placed {time_to_all:.1f} s after the first submission", flush=True)
        lost = await _missing_jobs(master, list(writes.acked))
        if lost:
            raise AssertionError(f"{len(lost)} acknowledged jobs lost across the failover, e.g. {lost[:5]}")
        # The checks read every job, then the machines: at rest, so that no task is placed between
        # the two reads (it would count as on a machine but not running in GetJob).
        with contextlib.suppress(TimeoutError):  # if it never rests, the reads say what is pending
            await _at_rest(watch, SETTLE_S)
        seen = await _placements(master, dict(writes.acked))
        twice = seen.on_machines_beyond_running + max(0, watch.beyond_bound)
        print(
            f"  after the kills: {seen.running} tasks running, {sum(seen.pending.values())} pending again "
            f"{dict(seen.pending)}, {seen.rescheduled} scheduled more than once; the machines list "
            f"{seen.on_machines_beyond_running} more than run, tasks_running was at most "
            f"{watch.beyond_bound} over the tasks submitted",
            flush=True,
        )
        new_leader = await elected_leader(channels, within=60, replicas=replicas)
        process = next(r for r in replicas if r.address == new_leader).process
        assert process is not None
        rss = psutil.Process(process.pid).memory_info().rss / (1 << 20)

        online_rate = await _online(master, writes, watch, size)
        stale_fraction, accepted, stale = watch.stale_fraction()
        print(f"  proposals judged over the run: {accepted} placements accepted, {stale} stale", flush=True)
        return {
            "time_to_all_scheduled_s": time_to_all,
            "failover_gap_s": writes.first_ack_after_kill - writes.killed_at,
            "acknowledged_writes_lost": float(len(lost)),
            "master_rss_mib": rss,
            "scheduler_kill_tasks_placed_twice": float(twice),
            "scheduler_kill_tasks_lost": float(seen.lost),
            "scheduler_kill_resume_s": watch.resume_s,
            "online_placements_per_s": online_rate,
            "scheduler_stale_fraction": stale_fraction,
        }, seen.machines
    finally:
        stop.set()
        for channel in channels.values():
            await channel.close()
        if watch is not None:
            watch.stop()
        stop_all(replicas)
        if fleets is not None:
            fleets.stop()


def _library(machines: list[machine_pb2.Machine], size: Size) -> tuple[float, float]:
    """(from-scratch seconds, online placements/s) of the scheduling library on the same cell:
    the same machines and tasks, the cell's policy (the scheduler process's own settings)."""
    view = BorgmasterSettings().scheduling_view(LifetimeTracker())
    specs = sorted((machine_spec_in(m.spec) for m in machines), key=lambda s: s.machine_id)
    cell_machines = [schedule_machine(spec, True) for spec in specs]
    shape = task_shape(job_spec_in(job_spec("shape", size.tasks_per_job)))

    def job(name: str, tasks: int) -> list[PlacementTask]:
        return [PlacementTask(f"{USER}/{name}", i, USER, shape) for i in range(tasks)]

    tasks = [t for j in range(size.cell_jobs) for t in job(f"cell-{j}", size.tasks_per_job)]
    tasks += job(PROBE, 1)
    hint = len(tasks) + size.online_jobs * size.tasks_per_job
    cell = new_cell(cell_machines, hint)
    scheduler = Scheduler(view.profile, view.config, np.random.default_rng(view.seed))
    started = time.perf_counter()
    result = scheduler.schedule(cell, tasks, now=0.0)
    from_scratch = time.perf_counter() - started
    placements = [(p.task, p.machine) for p in result.placements]
    print(f"  library: {len(placements)} of {len(tasks)} tasks placed from scratch in {from_scratch:.2f} s")
    arrivals = [job(f"online-{k}", size.tasks_per_job) for k in range(size.online_jobs)]
    best, placed = float("inf"), 0
    for _ in range(2):
        loaded = replay(cell_machines, placements, hint)
        online = Scheduler(view.profile, view.config, np.random.default_rng(view.seed))
        placed, seconds = online_stream(loaded, online, arrivals, np.random.default_rng(3), start=1.0)
        best = min(best, seconds)
    print(f"  library online: {placed} tasks placed in {best:.2f} s (best of 2; job exits included)")
    return from_scratch, placed / best


def run(report: Report, size: str = FULL) -> None:
    params = sized(SIZES, size)
    with embedded_stack("bench-borgmaster-cell-") as (stack, base):
        endpoints = BenchEndpoints.of(stack, stack.endpoints)
        security = SecuritySettings(tls_mode="mtls", certs_dir=stack.config.certs_dir)
        cell, machines = asyncio.run(_service(endpoints, security, base, params))
    library_s, library_rate = _library(machines, params)
    tasks = params.cell_jobs * params.tasks_per_job
    what = f"{REPLICAS} replicas, {params.machines} machines, {tasks} tasks"
    service_s, rate = cell["time_to_all_scheduled_s"], cell["online_placements_per_s"]
    units = {
        "time_to_all_scheduled_s": f"s ({what}: first submission -> every task placed; both kills included)",
        "failover_gap_s": "s (SIGKILL of the master -> the next acknowledged write)",
        "acknowledged_writes_lost": "jobs (must be 0)",
        "master_rss_mib": "MiB (the master's resident memory holding the cell)",
    }
    for key, unit in units.items():
        report(f"borgmaster.cell10k.{key}", cell[key], unit)
    report(
        "borgmaster.cell10k.vs_library_from_scratch",
        service_s / library_s,
        f"x (service {service_s:.1f} s / library {library_s:.2f} s, same cell; goal <= 2)",
    )
    kill = "borgmaster.cell10k.scheduler_kill"
    report(f"{kill}_tasks_placed_twice", cell["scheduler_kill_tasks_placed_twice"], "tasks (must be 0)")
    report(f"{kill}_tasks_lost", cell["scheduler_kill_tasks_lost"], "tasks (must be 0)")
    report(f"{kill}_resume_s", cell["scheduler_kill_resume_s"], "s (SIGKILL -> next placement accepted)")
    report("borgmaster.online_placements_per_s", rate, "placements/s (submit -> running, loaded cell)")
    report(
        "borgmaster.online_vs_library",
        rate / library_rate,
        f"x (service {rate:.0f} / library {library_rate:.0f} placements/s, same cell; goal >= 0.5)",
    )
    report("borgmaster.scheduler_stale_fraction", cell["scheduler_stale_fraction"], "(stale / proposed)")
