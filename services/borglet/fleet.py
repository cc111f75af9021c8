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
from cellpilot.borglet.hosted_task import (
    HostedTask,
    Limits,
    ProcessPlan,
    SimulatedPlan,
    TaskPlan,
    UnrunnablePlan,
)
from cellpilot.borglet.machine_agent import MachineAgent
from cellpilot.borglet.step_outcomes import TaskEnding, latest_usage, process_exit, task_endings
from cellpilot.borglet.task_lifecycle import Effect, Phase, PhaseEvent, PhaseStep
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
    rows: tuple[HostedTask, ...]
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
        self._checked: list[tuple[MachineAgent, HostedTask]] | None = None
        self._watchers: set[asyncio.Task[None]] = set()
        self.last_second = clock.now_ms() // 1000
        self.steps = 0

    # ----- task lifecycle -------------------------------------------------------------------

    def _changed(self) -> None:
        self._snapshot = None
        self._checked = None

    def checked_tasks(self) -> list[tuple[MachineAgent, HostedTask]]:
        """Running process tasks that declare a health check (Borg §2.6), kept until tasks change."""
        if self._checked is None:
            self._checked = [
                (machine, task)
                for machine in self.machine_list
                for task in machine.tasks.values()
                if task.phase is Phase.RUNNING
                and isinstance(task.plan.runtime, ProcessPlan)
                and task.plan.runtime.health_check is not None
            ]
        return self._checked

    def routing_changed(self, routing: Mapping[str, JobRouting] | None) -> None:
        """A new load-balancer view (the tasks each job's balancer routes to)."""
        self.routing = routing
        self._changed()

    def demand_jobs(self) -> set[str]:
        """Jobs with a shared demand that have a running task here."""
        return {
            task.plan.job_id
            for machine in self.machine_list
            for task in machine.tasks.values()
            if task.phase is Phase.RUNNING
            and isinstance(task.plan.runtime, SimulatedPlan)
            and task.plan.runtime.demand is not None
        }

    async def start_task(self, machine: MachineAgent, plan: TaskPlan, cause_id: str) -> HostedTask:
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
        task = HostedTask(machine.machine_id, plan, Phase.STARTING, started_ms=self.clock.now_ms())
        machine.tasks[plan.key] = task
        machine.packages.update(plan.package_ids)
        if isinstance(plan.runtime, UnrunnablePlan):
            self._fail(machine, task, plan.runtime.reason, cause_id)
            return task
        if task.simulated:
            self._advance(machine, task, PhaseEvent.started(cause_id, task.started_ms, "simulated"))
            return task
        try:
            handle = await self.runner.spawn(task)
        except Exception as error:  # command not found, permission denied, a bad environment...
            self._fail(machine, task, f"could not start: {_describe(error)}", cause_id)
            return task
        task.process = handle
        self._advance(machine, task, PhaseEvent.started(cause_id, task.started_ms, f"pid {handle.pid}"))
        watcher = asyncio.create_task(self._watch(machine, task, handle))
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)
        return task

    def _advance(self, machine: MachineAgent, task: HostedTask, event: PhaseEvent) -> PhaseStep:
        """Apply a lifecycle event (:meth:`MachineAgent.advance`) and send the signals it asks for."""
        step = machine.advance(task, event)
        if not step.allowed:
            log.warning(
                "task event ignored",
                extra={"cause_id": event.cause_id, "task": task.plan.name, "reason": step.reason},
            )
            return step
        self._changed()
        for effect in step.process_effects:
            handle = task.process
            assert isinstance(handle, ProcessHandle), f"{effect.value} needs the task's process"
            if effect is Effect.TERMINATE and event.grace_seconds > 0:
                self.runner.signal(handle, signal.SIGTERM)
                killer = asyncio.create_task(self._kill_after(handle, event.grace_seconds))
                self._watchers.add(killer)
                killer.add_done_callback(self._watchers.discard)
            else:  # KILL, or TERMINATE with no grace period
                self.runner.signal(handle, signal.SIGKILL)
        return step

    def _fail(
        self,
        machine: MachineAgent,
        task: HostedTask,
        detail: str,
        cause_id: str,
        at_ms: int | None = None,
    ) -> None:
        """The task failed here (not the machine): report it FAILED; kill its process if it has one."""
        plan = task.plan
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
        at_ms = at_ms or self.clock.now_ms()
        self._advance(machine, task, PhaseEvent.kill(TaskEvent.FAILED, -1, detail, cause_id, at_ms))

    def fail_task(self, machine: MachineAgent, task: HostedTask, detail: str, cause_id: str) -> None:
        """The task failed on its machine (e.g. its health checks): kill it, report it FAILED."""
        if task.phase is Phase.RUNNING:
            self._fail(machine, task, detail, cause_id)

    def _start_failed(self, machine: MachineAgent, plan: TaskPlan, detail: str, cause_id: str) -> None:
        """Starting failed outside the runtime's own error handling: record the task as failed."""
        task = machine.tasks.get(plan.key)
        if task is None or task.plan.incarnation != plan.incarnation:
            task = HostedTask(machine.machine_id, plan, Phase.STARTING, started_ms=self.clock.now_ms())
            machine.tasks[plan.key] = task
        self._fail(machine, task, detail, cause_id)

    async def _watch(self, machine: MachineAgent, task: HostedTask, handle: ProcessHandle) -> None:
        code = await self.runner.wait(handle)
        exited = process_exit(task, code, handle.oom_kills, handle.memory_peak, self.clock.now_ms())
        self._advance(machine, task, exited)

    async def stop_task(
        self,
        machine: MachineAgent,
        task: HostedTask,
        kind: TaskEvent,
        grace_seconds: float,
        cause_id: str,
        detail: str = "",
    ) -> None:
        """Stop a task: SIGTERM, then SIGKILL after the grace period (Borg §2.3), or SIGKILL now
        and wait a little for the exit; a task still being spawned is killed once it is."""
        stop = PhaseEvent.stop(kind, grace_seconds, cause_id, self.clock.now_ms(), detail)
        step = self._advance(machine, task, stop)
        handle = task.process
        if (
            Effect.TERMINATE in step.process_effects
            and grace_seconds <= 0
            and isinstance(handle, ProcessHandle)
        ):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(handle.exited.wait(), timeout=self.options.stop_wait_s)

    async def _kill_after(self, handle: ProcessHandle, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(handle.exited.wait(), timeout=seconds)
        if not handle.exited.is_set():
            self.runner.signal(handle, signal.SIGKILL)

    def update_task(
        self, task: HostedTask, limits: Limits, hard_memory_limit: bool, priority: int, spec_version: int
    ) -> None:
        """Change limits, limit kind and priority in place (Borg §2.3: no restart needed)."""
        task.plan = replace(
            task.plan,
            priority=priority,
            limits=limits,
            hard_memory_limit=hard_memory_limit,
            spec_version=spec_version,
        )
        if isinstance(task.process, ProcessHandle):
            self.runner.update_limits(task.process, limits, hard_memory_limit)
        self._changed()

    async def apply_desired(
        self, machine: MachineAgent, version: int, plans: Sequence[TaskPlan], cause_id: str
    ) -> None:
        """Converge on the master's desired set: kill duplicates, start the missing, update in place."""
        changes = diff_desired(machine.known_tasks(), plans)
        for known in changes.kill:
            task = machine.tasks[known.key]
            try:
                await self.stop_task(
                    machine,
                    task,
                    TaskEvent.KILLED,
                    0,
                    cause_id,
                    "duplicate: not in the master's desired task set",
                )
            except Exception as error:
                log.warning(
                    "could not kill a task",
                    extra={"cause_id": cause_id, "machine_id": machine.machine_id, "task": task.plan.name,
                           "error": _describe(error)},
                )  # fmt: skip
        for plan in changes.update:
            task = machine.tasks[plan.key]
            try:
                self.update_task(task, plan.limits, plan.hard_memory_limit, plan.priority, plan.spec_version)
            except Exception as error:
                self._fail(machine, task, f"could not update in place: {_describe(error)}", cause_id)
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
        rows: list[HostedTask] = []
        machine_index: list[int] = []
        for machine in self.machine_list:
            for task in machine.tasks.values():
                if task.phase is Phase.RUNNING:
                    rows.append(task)
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
            for task in list(machine.tasks.values()):
                if task.phase is Phase.RUNNING and isinstance(task.process, ProcessHandle):
                    try:
                        self.runner.meter(task.process)
                    except Exception as error:  # this task's metering, not the machine's
                        cause = f"meter:{task.plan.name}"
                        self._fail(machine, task, f"metering failed: {_describe(error)}", cause)

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
            task = snapshot.rows[usage.row]
            task.cpu_millicores = usage.cpu_millicores
            task.memory_bytes = usage.memory_bytes
            task.cpu_throttled = usage.cpu_throttled
            task.cpu_unmet_millicores = usage.cpu_unmet_millicores
        for ending in task_endings(snapshot.rows, result, self.last_second):
            task = snapshot.rows[ending.row]
            if task.phase is not Phase.RUNNING:  # already ended earlier in this step
                continue
            machine = self.machines[task.machine_id]
            if ending.event is TaskEvent.FAILED:
                self._fail(machine, task, ending.detail, ending.cause_id, ending.at_ms)
            elif ending.event is TaskEvent.OOM:
                attributes = {"cellpilot.cause_id": ending.cause_id, "cellpilot.machine_id": task.machine_id}
                with tracer.start_as_current_span("borglet oom kill", attributes=attributes):
                    self._advance(machine, task, _oom_kill(ending))
            else:
                self._advance(machine, task, _ended(ending))
        for machine in self.machine_list:
            machine.memory_pressure = bool(result.memory_pressure[machine.index])
        if self.publisher is not None:
            self.publisher.add(SampleChunk(snapshot.table, snapshot.identities, result))

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
                for task in list(machine.tasks.values()):
                    if task.alive and not task.simulated:
                        await self.stop_task(
                            machine, task, TaskEvent.KILLED, 0, "borglet-shutdown", "Borglet stopped"
                        )
        for watcher in list(self._watchers):
            watcher.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)


def _oom_kill(ending: TaskEnding) -> PhaseEvent:
    """The world model's memory enforcement kills the task (Autopilot §2.3): at once if simulated,
    SIGKILL to a process."""
    assert ending.memory_bytes is not None
    return PhaseEvent.kill(
        TaskEvent.OOM, ending.exit_code, ending.detail, ending.cause_id, ending.at_ms, ending.memory_bytes
    )


def _ended(ending: TaskEnding) -> PhaseEvent:
    """A simulated task ran its duration."""
    return PhaseEvent.exited(ending.event, ending.exit_code, ending.detail, ending.cause_id, ending.at_ms)


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
