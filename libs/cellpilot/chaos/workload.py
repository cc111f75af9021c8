"""The chaos run as a user of the cell: the demo workload, jobs submitted during the faults,
the poison and crash-looping jobs, and the probe that shows Autopilot acting again.

Everything goes through the public client as the demo user (an admin token minted from the
stack's secret, as ``cellpilot run`` does for its demo). A job counts as acknowledged when its
SubmitJob returned OK; every acknowledged job must be found at the end.

The probe: after each fault the demo's over-provisioned ``web-fat`` gets its 4 cores / 4 GiB
back (a user's edit). Autopilot right-sizes it again only through the whole pipeline working
after the fault (new windows, recommendations, a decision based on the edited spec, the
actuator, the Borgmaster master), so the first actuation on it after the edit is the measure
of "Autopilot acts again".
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

from cellpilot.api.v1 import job_pb2, machine_pb2, state_pb2
from cellpilot.chaos.chaos_run import ServicePorts
from cellpilot.client import CellpilotClient, CellpilotError, RetryPolicy, SyncCellpilotClient
from cellpilot.client.errors import InvalidArgumentError, NotFoundError
from cellpilot.client.job_spec_file import parse_job_spec
from cellpilot.demo import DEMO_USER, submit_demo_workload
from cellpilot.security.identity import ADMIN
from cellpilot.security.tls import SecuritySettings
from cellpilot.security.tokens import load_signer
from cellpilot.units import GIB

PROBE_JOB = f"{DEMO_USER}/web-fat"
PROBE_LIMITS = (4000, 4 * GIB)  # what web-fat asks for; Autopilot takes it to ~0.5 core / ~370 MiB
TOKEN_TTL_S = 24 * 3600
# Calls retry through failovers and store restarts (UNAVAILABLE) for this long.
CALL_BUDGET_S = 60.0
MISSING_COMMAND = "/nonexistent/cellpilot-chaos-poison"

_SMALL_JOB = """
name: {name}
user: demo
priority: 2
app_class: batch
task_count: 1
limits: {{cpu: 100m, memory: 64Mi}}
runtime:
  simulated: {{model: steady, params: {{cpu_millicores: 20, memory_bytes: 16777216}}, seed: {seed}}}
"""


def small_job(name: str, seed: int = 0) -> job_pb2.JobSpec:
    """A one-task batch job using next to nothing (each fault submits one while it lasts)."""
    return parse_job_spec(_SMALL_JOB.format(name=name, seed=seed))


def unknown_model_job(name: str) -> job_pb2.JobSpec:
    """Poison admission must refuse (INVALID_ARGUMENT naming the field): an unknown usage model."""
    spec = small_job(name)
    spec.task.runtime.simulated.usage_model = "no-such-model"
    return spec


def process_job(name: str, command: str, *args: str) -> job_pb2.JobSpec:
    spec = small_job(name)
    spec.task.runtime.Clear()
    spec.task.runtime.process.command = command
    spec.task.runtime.process.args.extend(args)
    return spec


@dataclass
class PoisonOutcome:
    refused_invalid_argument: int = 0  # the unknown-model job, refused as it must be
    refused_detail: str = ""
    accepted_unknown_model: int = 0  # the same, accepted: admission let poison in
    missing_command_job: str = ""  # accepted (the command is checked only on the machine)
    crash_loop_job: str = ""  # exits 1 at once, again and again


@dataclass(frozen=True)
class TaskFailures:
    failures: int  # in a row, as the Borgmaster counts them
    restarts: int
    state: str
    last_failure: str


@dataclass
class ChaosCell:
    data_dir: Path
    ports: ServicePorts
    acknowledged: list[str] = field(default_factory=list)
    submit_failures: list[str] = field(default_factory=list)
    _client: CellpilotClient | None = None

    def _options(self) -> dict[str, object]:
        token = load_signer(self.data_dir / "certs").issue_for(
            DEMO_USER, kind="user", capabilities=[ADMIN], ttl_s=TOKEN_TTL_S
        )
        options: dict[str, object] = SecuritySettings.load(self.data_dir / "stack.env").client_options()
        options["token"] = token
        return options

    def _addresses(self) -> tuple[list[str], list[str], list[str]]:
        ports = self.ports
        return ports.addresses("borgmaster"), ports.addresses("autopilot"), ports.addresses("aggregator")

    @property
    def client(self) -> CellpilotClient:
        if self._client is None:
            self._client = CellpilotClient(
                *self._addresses(),
                policy=RetryPolicy(budget_s=CALL_BUDGET_S),
                **self._options(),  # type: ignore[arg-type]
            )
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()

    async def submit_demo(self) -> list[str]:
        """The demo workload, as ``cellpilot run`` submits it; every job id is acknowledged."""

        def submit() -> list[str]:
            policy = RetryPolicy(budget_s=CALL_BUDGET_S)
            with SyncCellpilotClient(*self._addresses(), policy=policy, **self._options()) as client:  # type: ignore[arg-type]
                return [job_id for _, job_id in submit_demo_workload(client)]

        job_ids = await asyncio.to_thread(submit)
        self.acknowledged.extend(job_ids)
        return job_ids

    async def submit(self, spec: job_pb2.JobSpec) -> str | None:
        """SubmitJob; the job id once acknowledged (None: it failed, which is no broken promise)."""
        try:
            job_id = (await self.client.borgmaster.submit_job(spec)).job_id
        except CellpilotError as error:
            self.submit_failures.append(f"{spec.name}: {error.code.name} {error.details[:200]}")
            return None
        self.acknowledged.append(job_id)
        return job_id

    async def submit_poison(self, tag: str) -> PoisonOutcome:
        outcome = PoisonOutcome()
        try:
            job_id = (
                await self.client.borgmaster.submit_job(unknown_model_job(f"chaos-{tag}-unknown-model"))
            ).job_id
            outcome.accepted_unknown_model = 1
            self.acknowledged.append(job_id)
        except InvalidArgumentError as refused:
            outcome.refused_invalid_argument = 1
            outcome.refused_detail = refused.details
        outcome.missing_command_job = (
            await self.submit(process_job(f"chaos-{tag}-missing-command", MISSING_COMMAND)) or ""
        )
        outcome.crash_loop_job = (
            await self.submit(process_job(f"chaos-{tag}-crash-loop", "/bin/sh", "-c", "exit 1")) or ""
        )
        return outcome

    async def inflate_probe(self) -> int:
        """Give the probe job its 4 cores / 4 GiB back; returns the edit's checkpoint-log position."""
        spec = job_pb2.JobSpec()
        spec.task.limits.cpu_millicores, spec.task.limits.memory_bytes = PROBE_LIMITS
        paths = ["task.limits.cpu_millicores", "task.limits.memory_bytes"]
        return int((await self.client.borgmaster.update_job(PROBE_JOB, spec, paths)).log_sequence)

    async def probe_limits(self) -> tuple[int, int]:
        limits = (await self.client.borgmaster.get_job(PROBE_JOB)).job.spec.task.limits
        return limits.cpu_millicores, limits.memory_bytes

    async def missing_jobs(self) -> list[str]:
        """The acknowledged jobs the Borgmaster does not know (each asked for by id)."""
        missing = []
        for job_id in self.acknowledged:
            try:
                await self.client.borgmaster.get_job(job_id)
            except NotFoundError:
                missing.append(job_id)
        return missing

    async def machines_by_state(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for machine in await self.client.borgmaster.list_machines():
            name = machine_pb2.MachineState.Name(machine.state).removeprefix("MACHINE_STATE_").lower()
            counts[name] = counts.get(name, 0) + 1
        return counts

    async def task_failures(self, job_id: str) -> TaskFailures:
        task = (await self.client.borgmaster.get_job(job_id, include_tasks=True)).job.tasks[0]
        state = state_pb2.TaskState.Name(task.state).removeprefix("TASK_STATE_").lower()
        return TaskFailures(task.failures, task.restarts, state, task.last_failure)
