"""The machines one Borglet process hosts, their tasks, and the event-time loop that runs them.

One process hosts one machine (the normal Borglet, Borg §3.3) or many simulated ones (fleet
mode, for scale tests). Every event-second the loop samples every running task and enforces
limits (:mod:`cellpilot.borglet.fleet_ticks`, off the event loop for large fleets), then applies the outcome:
OOM kills, finished simulated tasks, the latest usage for reports, and samples handed to the
publisher. Tasks keep running whether or not a master polls (Borg §3.3, §4).

Whatever goes wrong with one task — a plan this Borglet cannot run, a command that cannot be
started, metering that raises, a usage model that cannot be evaluated — fails that task
(reported FAILED with the reason, logged at WARNING) and nothing else: the other tasks keep
running and being metered, and the machine keeps answering its polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
from opentelemetry import trace

from cellpilot.borg.lifecycle import TaskEvent
from cellpilot.borglet.desired_set import diff_desired
from cellpilot.borglet.fleet_ticks import JobRouting, MachineShape, build_table, run_ticks
from cellpilot.borglet.machine_agent import MachineAgent
from cellpilot.borglet.step_outcomes import (
    KILL_EXIT_CODE,
    KILL_REASON_TEXT,
    TaskEnding,
    latest_usage,
    task_endings,
)
from cellpilot.borglet.task_record import (
    Limits,
    Phase,
    ProcessPlan,
    SimulatedPlan,
    TaskPlan,
    TaskRecord,
    UnrunnablePlan,
)
from cellpilot.world.enforcement import KillReason
from cellpilot.world.step import MeasuredUsage, WorldStep, WorldTasks
from cellpilot_services.borglet.convert import SampleChunk
from cellpilot_services.borglet.event_clock import EventClock
from cellpilot_services.borglet.process_runtime import ProcessHandle, ProcessRunner
from cellpilot_services.borglet.sample_publisher import SamplePublisher

log = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)


class StaleIncarnationError(Exception):
    """A request names an older incarnation than the one running here."""


@dataclass(frozen=True)
class FleetOptions:
    pressure_fraction: float = 0.95
    meter_interval_s: float = 1.0
    min_step_wall_s: float = 0.05  # shortest wall sleep between steps (batches seconds when sped up)
    max_seconds_per_step: int = 120  # event-seconds processed per step when catching up
    thread_threshold: int = 2_000  # task-seconds above which a step runs off the event loop
    stop_wait_s: float = 2.0  # how long a kill without notice waits for the process to exit


@dataclass(frozen=True)
class _Snapshot:
    table: WorldTasks
    rows: tuple[TaskRecord, ...]
    identities: tuple[tuple[str, int, int], ...]
    process_rows: tuple[int, ...]


class Fleet:
    def __init__(
        self,
        machines: Sequence[MachineAgent],
        clock: EventClock,
        runner: ProcessRunner,
        publisher: SamplePublisher | None,
        options: FleetOptions | None = None,
    ) -> None:
        self.machine_list = list(machines)
        self.machines = {m.machine_id: m for m in self.machine_list}
        self.clock = clock
        self.runner = runner
        self.publisher = publisher
        self.options = options or FleetOptions()
        self._shape = MachineShape(
            cpu_millicores=np.array(
                [m.profile.capacity.cpu_millicores for m in self.machine_list], dtype=float
            ),
            memory_bytes=np.array([m.profile.capacity.memory_bytes for m in self.machine_list], dtype=float),
            pressure_fraction=self.options.pressure_fraction,
        )
        # How each job's load balancer sees it (set by a LoadBalancerView); None: no Borgmaster
        # to ask, this Borglet's own ready tasks share each job's demand.
        self.routing: Mapping[str, JobRouting] | None = None
        self._snapshot: _Snapshot | None = None
        self._checked: list[tuple[MachineAgent, TaskRecord]] | None = None
        self._watchers: set[asyncio.Task[None]] = set()
        self.last_second = clock.now_ms() // 1000
        self.steps = 0

    # ----- task lifecycle -------------------------------------------------------------------

    def _changed(self) -> None:
        self._snapshot = None
        self._checked = None

    def checked_tasks(self) -> list[tuple[MachineAgent, TaskRecord]]:
        """Running process tasks that declare a health check (Borg §2.6), kept until tasks change."""
        if self._checked is None:
            self._checked = [
                (machine, record)
                for machine in self.machine_list
                for record in machine.tasks.values()
                if record.phase is Phase.RUNNING
                and isinstance(record.plan.runtime, ProcessPlan)
                and record.plan.runtime.health_check is not None
            ]
        return self._checked

    def routing_changed(self, routing: Mapping[str, JobRouting] | None) -> None:
        """A new load-balancer view (the tasks each job's balancer routes to)."""
        self.routing = routing
        self._changed()

    def demand_jobs(self) -> set[str]:
        """Jobs with a shared demand that have a running task here."""
        return {
            record.plan.job_id
            for machine in self.machine_list
            for record in machine.tasks.values()
            if record.phase is Phase.RUNNING
            and isinstance(record.plan.runtime, SimulatedPlan)
            and record.plan.runtime.demand is not None
        }

    async def start_task(self, machine: MachineAgent, plan: TaskPlan, cause_id: str) -> TaskRecord:
        """Start a task (a no-op for an incarnation already known here)."""
        existing = machine.tasks.get(plan.key)
        if existing is not None:
            if existing.plan.incarnation == plan.incarnation:
                return existing
            if existing.alive:
                if existing.plan.incarnation > plan.incarnation:
                    raise StaleIncarnationError(
                        f"incarnation {plan.incarnation} of {plan.job_id}/{plan.task_index} is older than "
                        f"incarnation {existing.plan.incarnation} running on {machine.machine_id}"
                    )
                await self.stop_task(
                    machine,
                    existing,
                    TaskEvent.KILLED,
                    0,
                    cause_id,
                    f"replaced by incarnation {plan.incarnation}",
                )
        now = self.clock.now_ms()
        record = TaskRecord(machine.machine_id, plan, Phase.STARTING, started_ms=now)
        machine.tasks[plan.key] = record
        machine.packages.update(plan.package_ids)
        if isinstance(plan.runtime, UnrunnablePlan):
            self._fail(machine, record, plan.runtime.reason, cause_id)
            return record
        if record.simulated:
            self._running(machine, record, cause_id, "simulated")
            return record
        try:
            handle = await self.runner.spawn(record)
        except Exception as error:  # command not found, permission denied, a bad environment...
            self._fail(machine, record, f"could not start: {_describe(error)}", cause_id)
            return record
        record.process = handle
        if record.stop_kind is not None:  # stopped while it was starting
            record.phase = Phase.STOPPING
            self.runner.signal(handle, signal.SIGKILL)
        else:
            self._running(machine, record, cause_id, f"pid {handle.pid}")
        watcher = asyncio.create_task(self._watch(machine, record, handle))
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)
        return record

    def _fail(
        self,
        machine: MachineAgent,
        record: TaskRecord,
        detail: str,
        cause_id: str,
        at_ms: int | None = None,
    ) -> None:
        """The task failed here (not the machine): report it FAILED; kill its process if it has one."""
        plan = record.plan
        log.warning(
            "task failed on its machine",
            extra={
                "cause_id": cause_id,
                "machine_id": machine.machine_id,
                "job_id": plan.job_id,
                "task_index": plan.task_index,
                "incarnation": plan.incarnation,
                "reason": detail,
            },
        )
        if isinstance(record.process, ProcessHandle) and record.phase is not Phase.DEAD:
            self._kill_now(record, TaskEvent.FAILED, detail, cause_id, at_ms or self.clock.now_ms())
            return
        self._exited(machine, record, TaskEvent.FAILED, -1, detail, cause_id, at_ms)

    def fail_task(self, machine: MachineAgent, record: TaskRecord, detail: str, cause_id: str) -> None:
        """The task failed on its machine (e.g. its health checks): kill it, report it FAILED."""
        if record.phase is Phase.RUNNING:
            self._fail(machine, record, detail, cause_id)

    def _kill_now(self, record: TaskRecord, kind: TaskEvent, detail: str, cause: str, at_ms: int) -> None:
        """SIGKILL a process task; its watcher reports the exit as ``kind``."""
        assert isinstance(record.process, ProcessHandle)
        record.stop_kind, record.stop_detail, record.stop_cause = kind, detail, cause
        record.extra["stop_ms"] = at_ms
        record.phase = Phase.STOPPING
        self._changed()
        self.runner.signal(record.process, signal.SIGKILL)

    def _start_failed(self, machine: MachineAgent, plan: TaskPlan, detail: str, cause_id: str) -> None:
        """Starting failed outside the runtime's own error handling: record the task as failed."""
        record = machine.tasks.get(plan.key)
        if record is None or record.plan.incarnation != plan.incarnation:
            record = TaskRecord(machine.machine_id, plan, Phase.STARTING, started_ms=self.clock.now_ms())
            machine.tasks[plan.key] = record
        self._fail(machine, record, detail, cause_id)

    def _running(self, machine: MachineAgent, record: TaskRecord, cause_id: str, detail: str) -> None:
        record.phase = Phase.RUNNING
        machine.record_event(record, TaskEvent.RUNNING, record.started_ms, cause_id, detail)
        self._changed()

    def _exited(
        self,
        machine: MachineAgent,
        record: TaskRecord,
        kind: TaskEvent,
        exit_code: int,
        detail: str,
        cause_id: str,
        at_ms: int | None = None,
    ) -> None:
        if record.phase is Phase.DEAD:
            return
        record.phase = Phase.DEAD
        record.exit_kind = kind
        record.exit_code = exit_code
        record.exit_detail = detail
        record.exit_ms = at_ms if at_ms is not None else self.clock.now_ms()
        event = machine.record_event(record, kind, record.exit_ms, cause_id, detail)
        record.exit_sequence = event.sequence
        self._changed()

    async def _watch(self, machine: MachineAgent, record: TaskRecord, handle: ProcessHandle) -> None:
        code = await self.runner.wait(handle)
        if record.stop_kind is not None:
            kind, detail, cause = record.stop_kind, record.stop_detail, record.stop_cause
        elif code != 0 and handle.oom_kills > 0:
            record.memory_bytes = max(record.memory_bytes, handle.memory_peak)  # the memory at the kill
            detail = self._kernel_oom_detail(record, handle)
            kind, cause = TaskEvent.OOM, f"oom:{record.machine_id}:{record.plan.name}:kernel"
        elif code == 0:
            kind, detail, cause = TaskEvent.FINISHED, "exit code 0", f"exit:{record.plan.name}"
        else:
            kind, detail, cause = TaskEvent.FAILED, f"exit code {code}", f"exit:{record.plan.name}"
        self._exited(machine, record, kind, code, detail, cause, record.extra.get("stop_ms"))

    @staticmethod
    def _kernel_oom_detail(record: TaskRecord, handle: ProcessHandle) -> str:
        """The kernel OOM-killed the task in its cgroup (Borg §6.2: the Borglet "handles
        Out-of-Memory (OOM) events from the kernel"); say at which limit, with the kill count."""
        limit = record.plan.limits.memory_bytes
        counted = f"cgroup memory.events oom_kill {handle.oom_kills}"
        if record.plan.hard_memory_limit and limit > 0:
            return (
                f"{KILL_REASON_TEXT[KillReason.HARD_LIMIT]}: killed by the kernel at memory.max {limit} B "
                f"(peak {handle.memory_peak} B; {counted})"
            )
        reason = KILL_REASON_TEXT[KillReason.MACHINE_OUT_OF_MEMORY]
        return f"{reason}: killed by the kernel's OOM killer ({counted})"

    async def stop_task(
        self,
        machine: MachineAgent,
        record: TaskRecord,
        kind: TaskEvent,
        grace_seconds: float,
        cause_id: str,
        detail: str = "",
    ) -> None:
        """Kill a task: SIGTERM, then SIGKILL after the grace period (Borg §2.3), or SIGKILL now."""
        if not record.alive:
            return
        handle = record.process
        if record.stop_kind is None:
            record.stop_kind = kind
            record.stop_detail = detail or f"stopped by the master ({kind.value})"
            record.stop_cause = cause_id
            record.extra["stop_ms"] = self.clock.now_ms()
        if record.simulated:
            self._exited(machine, record, record.stop_kind, KILL_EXIT_CODE, record.stop_detail, cause_id)
            return
        if record.phase is Phase.STARTING or handle is None:
            return  # start_task kills it once spawned
        record.phase = Phase.STOPPING
        self._changed()
        if grace_seconds > 0:
            self.runner.signal(handle, signal.SIGTERM)
            task = asyncio.create_task(self._kill_after(handle, grace_seconds))
            self._watchers.add(task)
            task.add_done_callback(self._watchers.discard)
            return
        self.runner.signal(handle, signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(handle.exited.wait(), timeout=self.options.stop_wait_s)

    async def _kill_after(self, handle: ProcessHandle, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(handle.exited.wait(), timeout=seconds)
        if not handle.exited.is_set():
            self.runner.signal(handle, signal.SIGKILL)

    def update_task(
        self, record: TaskRecord, limits: Limits, hard_memory_limit: bool, priority: int, spec_version: int
    ) -> None:
        """Change limits, limit kind and priority in place (Borg §2.3: no restart needed)."""
        record.plan = replace(
            record.plan,
            priority=priority,
            limits=limits,
            hard_memory_limit=hard_memory_limit,
            spec_version=spec_version,
        )
        if isinstance(record.process, ProcessHandle):
            self.runner.update_limits(record.process, limits, hard_memory_limit)
        self._changed()

    async def apply_desired(
        self, machine: MachineAgent, version: int, plans: Sequence[TaskPlan], cause_id: str
    ) -> None:
        """Converge on the master's desired set: kill duplicates, start the missing, update in place."""
        changes = diff_desired(machine.known_tasks(), plans)
        for known in changes.kill:
            record = machine.tasks[known.key]
            try:
                await self.stop_task(
                    machine,
                    record,
                    TaskEvent.KILLED,
                    0,
                    cause_id,
                    "duplicate: not in the master's desired task set",
                )
            except Exception as error:
                log.warning(
                    "could not kill a task",
                    extra={"cause_id": cause_id, "machine_id": machine.machine_id, "task": record.plan.name,
                           "error": _describe(error)},
                )  # fmt: skip
        for plan in changes.update:
            record = machine.tasks[plan.key]
            try:
                self.update_task(
                    record, plan.limits, plan.hard_memory_limit, plan.priority, plan.spec_version
                )
            except Exception as error:
                self._fail(machine, record, f"could not update in place: {_describe(error)}", cause_id)
        machine.desired = {plan.key: plan.incarnation for plan in plans}
        machine.desired_version = version
        for plan in changes.start:
            try:
                await self.start_task(machine, plan, cause_id)
            except StaleIncarnationError as error:
                log.warning(
                    "desired task is older than the one running here",
                    extra={"cause_id": cause_id, "machine_id": machine.machine_id, "error": str(error)},
                )
            except Exception as error:
                self._start_failed(machine, plan, f"could not start: {_describe(error)}", cause_id)

    # ----- the event-time loop --------------------------------------------------------------

    def _table(self) -> _Snapshot:
        if self._snapshot is not None:
            return self._snapshot
        rows: list[TaskRecord] = []
        machine_index: list[int] = []
        for machine in self.machine_list:
            for record in machine.tasks.values():
                if record.phase is Phase.RUNNING:
                    rows.append(record)
                    machine_index.append(machine.index)
        table = build_table(rows, machine_index, self._shape, self.routing)
        identities = tuple((r.plan.job_id, r.plan.task_index, r.plan.incarnation) for r in rows)
        process_rows = tuple(np.flatnonzero(table.measured).tolist())
        self._snapshot = _Snapshot(table, tuple(rows), identities, process_rows)
        return self._snapshot

    def _process_usage(self, snapshot: _Snapshot) -> MeasuredUsage:
        usage = MeasuredUsage.none(snapshot.table.size)
        for row in snapshot.process_rows:
            handle = snapshot.rows[row].process
            if isinstance(handle, ProcessHandle):
                usage.cpu[row] = handle.cpu_millicores
                usage.memory[row] = handle.memory_bytes
                usage.throttled[row] = handle.kernel_throttled
                usage.unmet[row] = handle.throttled_millicores
        return usage

    def meter_processes(self) -> None:
        for machine in self.machine_list:
            for record in list(machine.tasks.values()):
                if record.phase is Phase.RUNNING and isinstance(record.process, ProcessHandle):
                    try:
                        self.runner.meter(record.process)
                    except Exception as error:  # this task's metering, not the machine's
                        cause = f"meter:{record.plan.name}"
                        self._fail(machine, record, f"metering failed: {_describe(error)}", cause)

    async def step(self) -> int:
        """Process the event-seconds elapsed since the last step; returns how many."""
        target = self.clock.now_ms() // 1000
        if target <= self.last_second:
            return 0
        first = self.last_second + 1
        count = min(target - self.last_second, self.options.max_seconds_per_step)
        seconds = np.arange(first, first + count, dtype=np.int64)
        snapshot = self._table()
        if snapshot.table.size:
            usage = self._process_usage(snapshot)
            if snapshot.table.size * count > self.options.thread_threshold:
                result = await asyncio.to_thread(run_ticks, snapshot.table, seconds, usage)
            else:
                result = run_ticks(snapshot.table, seconds, usage)
            self._apply(snapshot, result)
        self.last_second = first + count - 1
        self.steps += 1
        return count

    def _apply(self, snapshot: _Snapshot, result: WorldStep) -> None:
        for usage in latest_usage(result):
            record = snapshot.rows[usage.row]
            record.cpu_millicores = usage.cpu_millicores
            record.memory_bytes = usage.memory_bytes
            record.cpu_throttled = usage.cpu_throttled
            record.cpu_unmet_millicores = usage.cpu_unmet_millicores
        for ending in task_endings(snapshot.rows, result, self.last_second):
            record = snapshot.rows[ending.row]
            if record.phase is not Phase.RUNNING:  # already ended earlier in this step
                continue
            machine = self.machines[record.machine_id]
            if ending.event is TaskEvent.FAILED:
                self._fail(machine, record, ending.detail, ending.cause_id, ending.at_ms)
            elif ending.event is TaskEvent.OOM:
                assert ending.memory_bytes is not None
                record.memory_bytes = ending.memory_bytes
                attributes = {
                    "cellpilot.cause_id": ending.cause_id,
                    "cellpilot.machine_id": record.machine_id,
                }
                with tracer.start_as_current_span("borglet oom kill", attributes=attributes):
                    self._oom_kill(machine, record, ending)
            else:
                self._exited(
                    machine,
                    record,
                    ending.event,
                    ending.exit_code,
                    ending.detail,
                    ending.cause_id,
                    ending.at_ms,
                )
        for machine in self.machine_list:
            machine.memory_pressure = bool(result.memory_pressure[machine.index])
        if self.publisher is not None:
            self.publisher.add(SampleChunk(snapshot.table, snapshot.identities, result))

    def _oom_kill(self, machine: MachineAgent, record: TaskRecord, kill: TaskEnding) -> None:
        """Kill a task for memory (Autopilot §2.3): at once if simulated; SIGKILL to a process."""
        if record.simulated:
            self._exited(
                machine, record, TaskEvent.OOM, kill.exit_code, kill.detail, kill.cause_id, kill.at_ms
            )
        elif isinstance(record.process, ProcessHandle):
            self._kill_now(record, TaskEvent.OOM, kill.detail, kill.cause_id, kill.at_ms)

    async def run(self, stop: asyncio.Event) -> None:
        """Step through event time until ``stop``: meter processes, sample, enforce, publish."""
        next_meter = 0.0
        while not stop.is_set():
            if time.monotonic() >= next_meter:
                self.meter_processes()
                next_meter = time.monotonic() + self.options.meter_interval_s
            try:
                await self.step()
            except Exception:
                log.exception("borglet step failed")
            if self.clock.now_ms() // 1000 > self.last_second + self.options.max_seconds_per_step:
                await asyncio.sleep(0)  # behind: catch up, yielding to RPCs between steps
                continue
            delay = self.clock.wall_seconds_until((self.last_second + 1) * 1000)
            delay = min(
                max(delay, self.options.min_step_wall_s), max(0.0, next_meter - time.monotonic()) + 0.01
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay)

    async def shutdown(self, kill_tasks: bool) -> None:
        """Stop watching tasks; kill the processes this Borglet started if asked to."""
        if kill_tasks:
            for machine in self.machine_list:
                for record in list(machine.tasks.values()):
                    if record.alive and not record.simulated:
                        await self.stop_task(
                            machine, record, TaskEvent.KILLED, 0, "borglet-shutdown", "Borglet stopped"
                        )
        for watcher in list(self._watchers):
            watcher.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
