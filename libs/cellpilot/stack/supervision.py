"""``cellpilot run``'s supervision of every process it started, and the orderly stop of them all.

The :class:`Watchdog` watches each embedded component (PostgreSQL, Redis, the broker) and each
service replica. A process that dies is logged with its exit code or signal and started again
after a backoff, or left down once it has died too often (the policy is
:mod:`cellpilot.stack.restart_policy`; Borg §2.3 restarts failed tasks the same way). A
restarted broker comes back empty (its log is in memory) and gets its topics created again.
Every change is written to ``DATA_DIR/supervisor.json`` (:mod:`cellpilot.stack.supervision_state`),
which ``cellpilot stack status`` shows.

Stopping goes services first (all replicas at once), then the broker, Redis and PostgreSQL, each
with a short grace period before SIGKILL (:func:`cellpilot.stack.processes.stop_processes`).
``cellpilot stop`` asks a running supervisor to do that (:func:`stop_data_dir`), and does it
itself when no supervisor is running.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import psutil

from cellpilot.stack.broker_probe import PROBE_EVERY_S, SILENT_LIMIT_S, broker_answers
from cellpilot.stack.broker_retention import RotationSchedule, rotate_due
from cellpilot.stack.config import StackConfig, port_in_use
from cellpilot.stack.processes import ExitStatus, ProcessHandle, listening_ports, pid_alive
from cellpilot.stack.restart_policy import RestartHistory, RestartPolicy
from cellpilot.stack.services import ServiceSupervisor
from cellpilot.stack.supervision_state import Phase, SupervisorState, UnitState, UnitStatus
from cellpilot.stack.supervisor import Stack

# How often a service's listening ports are read again once known (they rarely change).
PORTS_REFRESH_S = 5.0
# How long `cellpilot stop` waits for a supervisor to stop everything before doing it itself.
SUPERVISOR_STOP_WAIT_S = 30.0

Log = Callable[[str], None]


@dataclass
class _Unit:
    """One supervised process and what the watchdog knows about it."""

    kind: Literal["component", "service"]
    name: str
    replica: int
    handle: ProcessHandle | None
    history: RestartHistory
    state: UnitState = "running"
    started_at: float = 0.0
    restart_at: float = 0.0
    last_exit: str | None = None
    ports: tuple[int, ...] = field(default_factory=tuple)

    @property
    def label(self) -> str:
        return self.name if self.kind == "component" else f"{self.name}[{self.replica}]"


class Watchdog:
    """Restarts what dies among a stack's components and service replicas; keeps the state file."""

    def __init__(
        self,
        stack: Stack,
        services: ServiceSupervisor,
        policy: RestartPolicy,
        log: Log = lambda _: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stack = stack
        self.services = services
        self.policy = policy
        self.log = log
        self.clock = clock
        self.phase: Phase = "starting"
        self.units: list[_Unit] = []
        # The in-memory broker honours no retention: topics that have one are rotated.
        self.rotations = RotationSchedule.starting(clock())
        self._ports_read_at = 0.0
        self._me = psutil.Process()
        self._broker_probed_at = clock()
        self._broker_silent_since: float | None = None

    @property
    def data_dir(self) -> Path:
        return self.stack.config.data_dir

    def watch_all(self) -> None:
        """Watch every component and every service replica started so far; mark the run up."""
        now = self.clock()
        self.units = [
            _Unit("component", c.name, 0, self.stack.handle(c.name), RestartHistory(self.policy))
            for c in self.stack.components()
        ]
        self.units += [
            _Unit(
                "service",
                s.name,
                s.replica,
                self.services.handle(s.name, s.replica),
                RestartHistory(self.policy),
            )
            for s in self.services.recorded()
        ]
        for unit in self.units:
            unit.started_at = now
            if unit.kind == "component":
                unit.ports = (self.stack.component(unit.name).port,)
        self.phase = "running"
        self.save()

    def tick(self) -> None:
        """One look at every process: note deaths, start what is due, refresh ports, save."""
        now = self.clock()
        changed = False
        for unit in self.units:
            if unit.state == "running":
                ended = unit.handle.poll() if unit.handle is not None else ExitStatus()
                if ended is not None:
                    self._died(unit, ended.describe(), now)
                    changed = True
            elif unit.state == "restarting" and now >= unit.restart_at:
                self._restart(unit)
                changed = True
        changed |= self._refresh_ports(now)
        memory_broker = self.stack.config.broker == "memory"  # the durable one enforces retention.ms
        kafka_up = any(u.name == "kafka" and u.state == "running" for u in self.units if u.kind != "service")
        if memory_broker and kafka_up:
            for line in rotate_due(self.stack.endpoints.broker_admin(), self.rotations, now):
                self.log(line)
        if kafka_up and now - self._broker_probed_at >= PROBE_EVERY_S:
            self._probe_broker(now)
        if changed:
            self.save()

    def _probe_broker(self, now: float) -> None:
        """A broker that answers nothing for ``SILENT_LIMIT_S`` is killed, so that the next tick
        restarts it like any dead component (cellpilot.stack.broker_probe)."""
        self._broker_probed_at = now
        if broker_answers(self.stack.endpoints.broker_admin()):
            self._broker_silent_since = None
            return
        silent_since = self._broker_silent_since = self._broker_silent_since or now
        unit = next((u for u in self.units if u.kind == "component" and u.name == "kafka"), None)
        if now - silent_since < SILENT_LIMIT_S or unit is None or unit.handle is None:
            return
        self.log(
            f"kafka (pid {unit.handle.pid}) runs but has answered no request for {now - silent_since:.0f} s: "
            "killing it, to be restarted"
        )
        unit.handle.send(signal.SIGKILL, group=False)
        self._broker_silent_since = None

    def _died(self, unit: _Unit, how: str, now: float) -> None:
        uptime = now - unit.started_at
        pid = unit.handle.pid if unit.handle is not None else "?"
        decision = unit.history.decide(now, uptime)
        unit.last_exit = how
        unit.ports = () if unit.kind == "service" else unit.ports
        if decision.give_up:
            unit.state = "gave-up"
            self.log(
                f"{unit.label} (pid {pid}) died: {how}, after {uptime:.1f} s; it was restarted "
                f"{decision.recent_restarts} times in the last {self.policy.window_s:.0f} s: giving up"
            )
        else:
            unit.state = "restarting"
            unit.restart_at = now + decision.delay_s
            self.log(
                f"{unit.label} (pid {pid}) died: {how}, after {uptime:.1f} s; "
                f"restart {unit.history.restarts} in {decision.delay_s:.1f} s"
            )

    def _restart(self, unit: _Unit) -> None:
        try:
            if unit.kind == "component":
                unit.handle = self.stack.restart_component(unit.name, progress=self.log)
                if unit.name == "kafka":  # a new, empty broker
                    self.rotations = RotationSchedule.starting(self.clock())
            else:
                unit.handle = self.services.restart(unit.name, unit.replica)
        except Exception as error:  # a start that fails counts as one more death
            first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
            self.log(f"{unit.label}: restart failed: {first_line}")
            self._stop_failed_start(unit)
            self._died(unit, f"restart failed: {first_line}", self.clock())
            return
        unit.state = "running"
        unit.started_at = self.clock()
        self.log(f"{unit.label}: restarted (pid {unit.handle.pid}, restart {unit.history.restarts})")

    def _stop_failed_start(self, unit: _Unit) -> None:
        """A component started but never became healthy: do not leave it running half-started."""
        if unit.kind != "component":
            return
        handle = self.stack.handle(unit.name)
        if handle is not None and handle.poll() is None:
            handle.send(signal.SIGKILL, group=True)
            handle.poll()

    def _refresh_ports(self, now: float) -> bool:
        refresh_all = now - self._ports_read_at >= PORTS_REFRESH_S
        if refresh_all:
            self._ports_read_at = now
        changed = False
        for unit in self.units:
            if unit.kind != "service" or unit.state != "running" or unit.handle is None:
                continue
            if refresh_all or not unit.ports:
                ports = tuple(listening_ports(unit.handle.pid))
                changed |= ports != unit.ports
                unit.ports = ports
        return changed

    # -- the state file and the orderly stop ------------------------------------------------------
    def state(self) -> SupervisorState:
        now = self.clock()
        return SupervisorState(
            pid=self._me.pid,
            started_at=self._me.create_time(),
            phase=self.phase,
            units=tuple(
                UnitStatus(
                    kind=unit.kind,
                    name=unit.name,
                    replica=unit.replica,
                    pid=unit.handle.pid if unit.handle is not None else None,
                    state=unit.state,
                    restarts=unit.history.restarts,
                    ports=unit.ports,
                    last_exit=unit.last_exit,
                    restart_in_s=round(max(0.0, unit.restart_at - now), 1)
                    if unit.state == "restarting"
                    else None,
                )
                for unit in self.units
            ),
        )

    def save(self) -> None:
        self.state().save(self.data_dir)

    def stop_all(self) -> None:
        """Services first (every replica at once), then the broker, Redis, PostgreSQL."""
        self.phase = "stopping"
        self.save()
        stop_all(self.stack, self.services, self.log)
        for unit in self.units:
            if unit.state != "gave-up":
                unit.state = "stopped"
            unit.ports = ()
        self.phase = "stopped"
        self.save()


def stop_all(stack: Stack, services: ServiceSupervisor, log: Log) -> None:
    """Stop every service replica, then the embedded stack (broker, Redis, PostgreSQL)."""
    log("stopping services")
    services.stop(log=log)
    stack.down(progress=log)


def stop_data_dir(data_dir: Path, log: Log) -> None:
    """Stop everything ``cellpilot run`` started in ``data_dir``.

    A running supervisor is asked (SIGTERM) to stop everything in order; if there is none, or it
    does not finish in time, the processes the state files name are stopped from here.
    """
    state = SupervisorState.load(data_dir)
    supervised = state is not None and state.supervisor_alive()
    if state is not None and supervised:
        log(f"asking cellpilot run (pid {state.pid}) to stop everything")
        os.kill(state.pid, signal.SIGTERM)
        deadline = time.monotonic() + SUPERVISOR_STOP_WAIT_S
        while state.supervisor_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        if state.supervisor_alive():
            log(f"cellpilot run (pid {state.pid}) did not stop in {SUPERVISOR_STOP_WAIT_S:.0f} s; killing it")
            os.kill(state.pid, signal.SIGKILL)
        else:
            log(f"cellpilot run (pid {state.pid}) stopped")
    stack = Stack(StackConfig(data_dir))
    services = ServiceSupervisor(stack.config.data_dir, stack.config.env_path)
    if services.running() or any(row.running for row in stack.status()):
        stop_all(stack, services, log)
    elif not supervised:
        log(f"nothing of {stack.config.data_dir} is running")


@dataclass(frozen=True)
class StackStatus:
    """Every component and service replica of a data directory, and its supervisor if one runs."""

    supervisor: SupervisorState | None
    units: tuple[UnitStatus, ...]
    # Components that run but whose port does not accept connections.
    not_listening: tuple[str, ...] = ()

    @property
    def healthy(self) -> bool:
        return bool(self.units) and not self.not_listening and all(u.state == "running" for u in self.units)


def stack_status(data_dir: Path) -> StackStatus:
    """What runs in ``data_dir``: the supervisor's state file while ``cellpilot run`` runs (each pid
    checked again), otherwise what the stack's and the services' state files record."""
    stack = Stack(StackConfig(data_dir))
    components = {component.name: component for component in stack.components()}
    state = SupervisorState.load(stack.config.data_dir)
    if state is not None and not state.supervisor_alive():
        state = None
    if state is not None and state.phase != "starting":
        units = tuple(
            replace(unit, state="stopped", ports=())
            if unit.state == "running" and (unit.pid is None or not pid_alive(unit.pid))
            else unit
            for unit in state.units
        )
    else:
        units = tuple(
            UnitStatus(
                kind="component",
                name=row.name,
                replica=0,
                pid=row.pid,
                state="running" if row.running else "stopped",
                ports=(row.port,),
            )
            for row in stack.status()
        )
        services = ServiceSupervisor(stack.config.data_dir, stack.config.env_path)
        alive = set(services.running())
        for service in services.recorded():
            running = service in alive
            units += (
                UnitStatus(
                    kind="service",
                    name=service.name,
                    replica=service.replica,
                    pid=service.pid,
                    state="running" if running else "stopped",
                    ports=tuple(listening_ports(service.pid)) if running else (),
                ),
            )
    not_listening = tuple(
        unit.name
        for unit in units
        if unit.kind == "component"
        and unit.state == "running"
        and not port_in_use(stack.config.host, components[unit.name].port)
    )
    return StackStatus(state, units, not_listening)
