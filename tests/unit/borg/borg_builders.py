"""Small builders for the Borgmaster core tests, and an in-memory master that logs what it applies."""

from __future__ import annotations

from dataclasses import dataclass, field

from cellpilot.borg.cell_state import CellState
from cellpilot.borg.changes import Change
from cellpilot.borg.decisions import Accepted, Command, RegisterMachine, Result, SetQuota, handle
from cellpilot.borg.model import AutopilotConfig, Constraint, JobSpec, MachineSpec, SimulatedRuntime, TaskSpec
from cellpilot.borg.mutations import LogRecord, Mutation, to_records
from cellpilot.borg.scheduling_view import Plan, SchedulingView
from cellpilot.job_vocabulary import AppClass, PriorityBand
from cellpilot.schedule import Resources
from cellpilot.units import GIB


def job_spec(
    name: str = "web",
    user: str = "alice",
    priority: int = 9,
    task_count: int = 2,
    cpu: float = 1000,
    ram_gib: float = 1,
    ports: int = 0,
    constraints: tuple[Constraint, ...] = (),
    autopilot: AutopilotConfig | None = None,
    app_class: AppClass = AppClass.LATENCY_SENSITIVE,
    runtime: SimulatedRuntime | None = None,
) -> JobSpec:
    return JobSpec(
        name=name,
        user=user,
        priority=priority,
        task=TaskSpec(Resources(cpu, ram_gib * GIB, 0, ports), runtime=runtime or SimulatedRuntime("steady")),
        task_count=task_count,
        app_class=app_class,
        constraints=constraints,
        autopilot=autopilot or AutopilotConfig(),
    )


def machine_spec(
    machine_id: str = "m0",
    cpu: float = 4000,
    ram_gib: float = 8,
    ports: int = 10,
    attributes: tuple[tuple[str, str], ...] = (),
    address: str = "127.0.0.1:7000",
) -> MachineSpec:
    return MachineSpec(
        machine_id, address, Resources(cpu, ram_gib * GIB, 100 * GIB, ports), attributes, first_port=20000
    )


@dataclass
class Master:
    """The pure core wired like the service: decide, log, apply, let the view follow."""

    state: CellState = field(default_factory=CellState)
    view: SchedulingView = field(default_factory=SchedulingView)
    log: list[LogRecord] = field(default_factory=list)
    now_ms: int = 1_000_000
    epoch: int = 1

    def commit(
        self, mutations: tuple[Mutation, ...] | list[Mutation], command: Command | None = None
    ) -> list[Change]:
        records = to_records(
            self.state.last_sequence + 1,
            self.epoch,
            self.now_ms,
            mutations,
            command.request_id if command else "",
            "test",
            request_method=command.method if command else "",
            request_digest=command.payload_digest if command else "",
        )
        changes: list[Change] = []
        for record in records:
            self.log.append(record)
            applied = self.state.apply(record)
            self.view.observe(self.state, applied)
            changes += applied
        self.now_ms += 1000
        return changes

    def run(self, command: Command) -> Result:
        result = handle(self.state, command, self.now_ms, self.view)
        if isinstance(result, Accepted) and result.mutations:
            self.commit(result.mutations, command)
        return result

    def accept(self, command: Command) -> Accepted:
        result = self.run(command)
        assert isinstance(result, Accepted), result
        return result

    def schedule(self) -> Plan:
        plan = self.view.plan(self.state, self.now_ms)
        if plan.mutations:
            self.commit(plan.mutations)
        return plan

    def add_machines(self, *specs: MachineSpec) -> None:
        for spec in specs:
            self.accept(RegisterMachine("", spec))

    def grant(self, user: str, band: PriorityBand, cores: float = 1000, ram_gib: float = 1000) -> None:
        self.accept(SetQuota("", user, band, Resources(cores * 1000, ram_gib * GIB, 1e15, 10_000)))


def replay(log: list[LogRecord]) -> CellState:
    state = CellState()
    state.apply_all(log)
    return state
