"""The chaos run from start to end: start, warm up, fault after fault, drain, read, check, stop.

After each fault the driver, at once and together: submits a small job (acknowledged or not,
while the fault lasts), gives the probe job its over-provisioned limits back (see
:mod:`cellpilot.chaos.workload`) and waits for the supervisor to have the killed process
running again; then it waits until Autopilot has right-sized the probe again (the first
actuation applied on it after the edit, read from the checkpoint log) or the plan's bound
passes, and pauses ``settle_s`` before the next fault.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from cellpilot.chaos import evidence as stores
from cellpilot.chaos.chaos_run import ChaosRun, ServicePorts, free_port_block
from cellpilot.chaos.forger import forge
from cellpilot.chaos.plan import ChaosPlan, Fault
from cellpilot.chaos.report import FaultRecord, Figure, RunFacts, all_figures
from cellpilot.chaos.stream_ledger import StreamObserver
from cellpilot.chaos.workload import PROBE_JOB, PROBE_LIMITS, ChaosCell, small_job
from cellpilot.client import CellpilotError
from cellpilot.platform.stream_access import StreamAccess
from cellpilot.security.store_secrets import ADMIN_ACCOUNT
from cellpilot.stack import StackEndpoints

T = TypeVar("T")
POLL_S = 0.5


class Progress:
    """Where the driver says what it does (the CLI shows it with Rich; tests print it)."""

    def step(self, text: str) -> None:  # what it is doing now
        print(text, flush=True)

    def event(self, text: str) -> None:  # something that happened
        print(text, flush=True)

    def fault_done(self) -> None:
        pass


@dataclass
class ChaosResult:
    figures: list[Figure]
    facts: RunFacts
    stopped: str


async def retrying(call: Callable[[], Awaitable[T]], limit_s: float, what: str) -> T:
    """``call()`` until it succeeds (a store being restarted refuses for a while)."""
    deadline = time.monotonic() + limit_s
    while True:
        try:
            return await call()
        except Exception as error:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: still failing after {limit_s:.0f} s: {error!r}") from error
            await asyncio.sleep(POLL_S)


class ChaosDriver:
    def __init__(self, plan: ChaosPlan, data_dir: Path, progress: Progress | None = None) -> None:
        self.plan = plan
        self.progress = progress or Progress()
        self.run = ChaosRun(data_dir, ServicePorts(free_port_block()), dict(plan.run_env))
        self.cell = ChaosCell(data_dir, self.run.ports)
        self.records: list[FaultRecord] = []
        self._endpoints: StackEndpoints | None = None

    @property
    def endpoints(self) -> StackEndpoints:
        assert self._endpoints is not None, "the run is not started"
        return self._endpoints

    async def execute(self) -> ChaosResult:
        began = time.monotonic()
        observer: StreamObserver | None = None
        try:
            self.progress.step(
                f"starting cellpilot run in {self.run.data_dir} (services from port {self.run.ports.first})"
            )
            self._endpoints = await self.run.start()
            observer = StreamObserver(
                StreamAccess.observer(
                    self.endpoints.kafka_bootstrap,
                    Path(self.endpoints.certs_dir),
                    self.endpoints.broker_login(ADMIN_ACCOUNT),
                )
            )
            await observer.start()
            self.progress.step("submitting the demo workload")
            jobs = await self.cell.submit_demo()
            self.progress.event(f"demo workload submitted: {', '.join(jobs)}")
            warm_up_s = await self._warm_up()
            for index, fault in enumerate(self.plan.faults):
                self.records.append(await self._fault(index, fault))
                self.progress.fault_done()
                await asyncio.sleep(self.plan.settle_s)
            self.progress.step(f"letting the pipeline drain for {self.plan.drain_s:.0f} s")
            await asyncio.sleep(self.plan.drain_s)
            ledger = await observer.stop()
            observer = None
            self.progress.step("reading the stores and checking the invariants")
            facts = await self._facts(warm_up_s)
            evidence = await retrying(lambda: stores.read_stores(self.endpoints), 60, "reading the stores")
            resets = stores.logged_log_resets(sorted(self.run.logs.glob("*.log")))
            facts.wall_s = time.monotonic() - began
            figures = all_figures(ledger, evidence, facts, resets)
        finally:
            if observer is not None:
                with contextlib.suppress(Exception):
                    await observer.stop()
            await self.cell.close()
            stopped = await self._stop()
        return ChaosResult(figures, facts, stopped)

    async def _stop(self) -> str:
        self.progress.step("stopping cellpilot run")
        return await self.run.stop()

    async def _warm_up(self) -> float | None:
        """Wait until Autopilot has right-sized the probe once (it works before anything breaks)."""
        self.progress.step(
            f"waiting for Autopilot to right-size {PROBE_JOB} (at most {self.plan.warm_up_limit_s:.0f} s)"
        )
        began = time.monotonic()
        while time.monotonic() - began < self.plan.warm_up_limit_s:
            with contextlib.suppress(CellpilotError):
                cpu, memory = await self.cell.probe_limits()
                if (cpu, memory) != PROBE_LIMITS:
                    took = time.monotonic() - began
                    self.progress.event(
                        f"Autopilot right-sized {PROBE_JOB} to {cpu}m / {memory >> 20} MiB after {took:.0f} s"
                    )
                    return took
            await asyncio.sleep(POLL_S)
        self.progress.event(
            f"Autopilot did not right-size {PROBE_JOB} within {self.plan.warm_up_limit_s:.0f} s"
        )
        return None

    async def _fault(self, index: int, fault: Fault) -> FaultRecord:
        record = FaultRecord(fault)
        self.progress.step(f"fault {index + 1}/{len(self.plan.faults)}: {fault.description}")
        unit: tuple[str, int] | None = None
        old_pid = 0
        try:
            if fault.kind == "poison-jobs":
                record.at = time.time()
                record.poison = await self.cell.submit_poison(f"{index}")
                record.target = "poison and crash-looping jobs"
            elif fault.kind == "forge-records":
                record.at = time.time()
                stolen = self.endpoints.broker_login("dashboard")  # forger.py: a compromised service
                access = StreamAccess.admin(self.endpoints.kafka_bootstrap, stolen)
                record.forgery = await forge(access, int(record.at * 1000))
                record.target = f"{len(record.forgery.written)} forged and replayed records"
            else:
                unit = (fault.target, await self._replica_of(fault))
                record.target = f"{unit[0]}[{unit[1]}]" if fault.kind == "kill-service" else fault.target
                record.at = time.time()
                old_pid = self.run.kill(*unit)
            self.progress.event(f"{fault.name}: {record.target} (pid {old_pid or '-'})")
        except Exception as error:  # a fault that could not be done is reported, not hidden
            record.error = f"could not inject: {error!r}"
            self.progress.event(f"{fault.name}: {record.error}")
            return record
        restarted, acknowledged, edit, poison = await asyncio.gather(
            self.run.wait_restarted(*unit, old_pid, self.plan.recovery_limit_s) if unit else _none(),
            self.cell.submit(small_job(f"chaos-{index}-{fault.name.replace('_', '-')}", index)),
            self._inflate_probe(record),
            self.cell.submit_poison(f"{index}") if fault.with_poison else _none(),
        )
        record.poison = record.poison or poison
        record.restarted_after_s, record.acknowledged_job, record.probe_edit_seq = (
            restarted,
            acknowledged,
            edit,
        )
        if unit is not None:
            self.progress.event(
                f"{record.target} running again after {restarted:.1f} s"
                if restarted is not None
                else f"{record.target} not running again within {self.plan.recovery_limit_s:.0f} s"
            )
        if edit is not None:
            acted = await self._acted_again(record, edit)
            self.progress.event(
                f"Autopilot acted again {acted:.1f} s after the fault"
                if acted is not None
                else f"Autopilot did not act within {self.plan.recovery_limit_s:.0f} s of the fault"
            )
        return record

    async def _replica_of(self, fault: Fault) -> int:
        if fault.replica is not None:
            return fault.replica
        if fault.kind == "restart-component":
            return 0
        if fault.target == "borgmaster":
            return (
                await retrying(lambda: stores.borgmaster_master(self.endpoints), 30, "the Borgmaster master")
            )[0]
        holder = await retrying(lambda: stores.autopilot_master(self.endpoints), 30, "the Autopilot master")
        return stores.replica_of(holder.holder)

    async def _inflate_probe(self, record: FaultRecord) -> int | None:
        try:
            return await self.cell.inflate_probe()
        except CellpilotError as error:
            record.error = f"probe edit failed: {error.code.name} {error.details[:160]}"
            return None

    async def _acted_again(self, record: FaultRecord, edit_seq: int) -> float | None:
        """Seconds from the fault to the first actuation on the probe after its edit (None: not in time)."""
        deadline = record.at + self.plan.recovery_limit_s
        while time.time() < deadline:
            with contextlib.suppress(Exception):  # PostgreSQL may be restarting
                for actuation in await stores.logged_actuations(self.endpoints, after_seq=edit_seq):
                    if actuation.job_id == PROBE_JOB:
                        return max(0.0, actuation.appended_at - record.at)
            await asyncio.sleep(POLL_S)
        return None

    async def _facts(self, warm_up_s: float | None) -> RunFacts:
        missing = await retrying(self.cell.missing_jobs, 60, "looking the acknowledged jobs up")
        machines = await retrying(self.cell.machines_by_state, 60, "listing the machines")
        facts = RunFacts(
            self.plan.name,
            self.records,
            list(self.cell.acknowledged),
            missing,
            list(self.cell.submit_failures),
            machines,
            warm_up_s=warm_up_s,
            recovery_limit_s=self.plan.recovery_limit_s,
        )
        for record in self.records:
            poison = record.poison
            if poison is None:
                continue
            for label, job_id in (
                ("missing_command", poison.missing_command_job),
                ("crash_loop", poison.crash_loop_job),
            ):
                if job_id:
                    facts.poison_failures[label] = await retrying(
                        functools.partial(self.cell.task_failures, job_id), 30, f"reading {job_id}"
                    )
        return facts


async def _none() -> None:
    return None
