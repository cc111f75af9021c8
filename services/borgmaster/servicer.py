"""The Borgmaster gRPC API (borgmaster.proto) over one replica.

Reads are answered by every replica from its in-memory copy. Writes go to the elected
master; a follower refuses them with FAILED_PRECONDITION and names the master in the
``cellpilot-leader`` trailing metadata. While no master is known — an election, or
PostgreSQL unreachable so that nobody can append or hold the lease — a write gets
UNAVAILABLE saying which, so clients retry it (with the same request id) instead of giving
up. Refusals of the core map to gRPC codes (INVALID_ARGUMENT naming the field,
RESOURCE_EXHAUSTED for quota, ALREADY_EXISTS for a reused request id, NOT_FOUND, ...), with
``cellpilot-error-reason`` where the code alone is ambiguous. Each request's cause id (its
request id, or a fresh one) goes to the log record, the logs and the trace span.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any, NoReturn

import grpc
from opentelemetry import trace

from cellpilot.api.v1 import (
    borgmaster_pb2,
    borgmaster_pb2_grpc,
    job_pb2,
    lifetimes_pb2,
    machine_pb2,
    state_pb2,
)
from cellpilot.borg.cell_state import JobRecord, MachineRecord
from cellpilot.borg.decisions import (
    Command,
    KillJob,
    RegisterMachine,
    SetMachineState,
    SetQuota,
    SubmitJob,
    UpdateJob,
)
from cellpilot.borg.lifecycle import JobState, TaskState
from cellpilot.borg.model import MachineAvailability
from cellpilot.borg.pending_reasons import explain
from cellpilot.borg.rejection import Code, Rejection
from cellpilot.borg.task_lifetimes import TooLittleHistory
from cellpilot.borg_wire import lifetimes, specs, statuses
from cellpilot.job_vocabulary import PriorityBand
from cellpilot.platform import error_reasons
from cellpilot.platform.request_validation import (
    abort,
    first_page,
    invalid_fields_refused,
    requested_page,
)
from cellpilot.platform.store_outage import StoreUnavailable
from cellpilot_services.borgmaster.lifetime_keeper import LifetimeKeeper
from cellpilot_services.borgmaster.replica import NotLeader, Replica

log = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

DEFAULT_JOBS_PAGE = 100
DEFAULT_MACHINES_PAGE = 500
MAX_PAGE = 5_000
STATUS = {
    Code.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    Code.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Code.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    Code.FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
    Code.RESOURCE_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


# The ``cellpilot-error-reason`` of a refusal whose status code is shared by several causes,
# by the code and the field the refusal names.
REASONS = {
    (Code.ALREADY_EXISTS, "request_id"): error_reasons.REQUEST_ID_REUSED,
    (Code.FAILED_PRECONDITION, "fencing_token"): error_reasons.FENCED,
    (Code.FAILED_PRECONDITION, "expected_spec_version"): error_reasons.STALE_SPEC_VERSION,
}


def _reason(rejection: Rejection) -> str:
    if rejection.code is Code.RESOURCE_EXHAUSTED:
        return error_reasons.QUOTA_EXCEEDED
    return REASONS.get((rejection.code, rejection.field), "")


class BorgmasterServicer(borgmaster_pb2_grpc.BorgmasterServicer):
    def __init__(self, replica: Replica, lifetimes: LifetimeKeeper | None = None) -> None:
        self.replica = replica
        self.lifetimes = lifetimes or LifetimeKeeper(replica, replica.settings)

    # ------------------------------------------------------------------ plumbing
    async def _no_master_here(self, context: grpc.aio.ServicerContext, error: NotLeader) -> NoReturn:
        """A write this replica cannot take: redirect to the master if one is known, else
        UNAVAILABLE (retryable) saying why there is none."""
        leader = error.leader or self.replica.leader_address() or ""
        if leader and leader != self.replica.address:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{error}; the master is {leader}",
                trailing_metadata=(
                    (error_reasons.LEADER_METADATA_KEY, leader),
                    *error_reasons.reason_metadata(error_reasons.NOT_MASTER),
                ),
            )
            raise AssertionError("unreachable") from error  # pragma: no cover
        problem = self.replica.store_problem()
        if problem:
            await abort(
                context,
                grpc.StatusCode.UNAVAILABLE,
                f"no elected Borgmaster master: {problem}; retry with the same request_id",
                error_reasons.STORE_UNAVAILABLE,
            )
        await abort(
            context,
            grpc.StatusCode.UNAVAILABLE,
            f"no elected Borgmaster master at the moment ({error}; an election is under way); "
            "retry with the same request_id",
            error_reasons.NO_MASTER,
        )

    def _name_the_master(self, context: grpc.aio.ServicerContext) -> None:
        """A follower answers reads from its warm copy, but soft state (usage, readiness) lives
        with the master: name it, so clients send their next calls there."""
        if not self.replica.is_leader and (leader := self.replica.leader_address()):
            context.set_trailing_metadata(((error_reasons.LEADER_METADATA_KEY, leader),))

    async def _soft_state_read(self, context: grpc.aio.ServicerContext) -> None:
        """A read that shows soft state — tasks' usage, reservations and readiness, machines'
        usage — goes to the master: only the master polls the Borglets (Borg §3.3), so a
        follower's copy has the replicated state without them, and answering from it would show
        every task idle. A follower redirects such a read like a write while a master is known;
        with none known (an election under way) it answers from its warm copy, without them."""
        if self.replica.is_leader:
            return
        leader = self.replica.leader_address()
        if leader and leader != self.replica.address:
            await self._no_master_here(
                context, NotLeader(leader, "a follower: usage and reservations live with the master")
            )
        self._name_the_master(context)

    async def _write(self, command: Command, context: grpc.aio.ServicerContext) -> tuple[Any, int]:
        cause = command.request_id or f"req-{uuid.uuid4().hex[:12]}"
        with tracer.start_as_current_span(f"Borgmaster.{type(command).__name__}") as span:
            span.set_attribute("cellpilot.cause_id", cause)
            try:
                result, seq = await self.replica.execute(command, cause)
            except NotLeader as error:
                await self._no_master_here(context, error)
            except StoreUnavailable as error:
                span.set_attribute("cellpilot.rejected", str(error))
                await abort(
                    context,
                    grpc.StatusCode.UNAVAILABLE,
                    f"{error}; the write was not acknowledged: retry it with the same request_id",
                    error_reasons.STORE_UNAVAILABLE,
                )
            if isinstance(result, Rejection):
                span.set_attribute("cellpilot.rejected", str(result))
                log.info(
                    "request refused",
                    extra={"cause_id": cause, "code": result.code.value, "reason": str(result)},
                )
                await abort(context, STATUS[result.code], str(result), _reason(result))
            log.info(
                "request applied", extra={"cause_id": cause, "seq": seq, "command": type(command).__name__}
            )
            return result, seq

    async def _reused_request_id(self, context: grpc.aio.ServicerContext, request_id: str) -> NoReturn:
        """A request id an earlier, different request used (logged before requests recorded
        their method and payload digest): its recorded answer is not this one's."""
        await abort(
            context,
            grpc.StatusCode.ALREADY_EXISTS,
            f"request_id: {request_id!r} was already used by another request; use a new id",
            error_reasons.REQUEST_ID_REUSED,
        )

    async def _convert_or_abort(self, context: grpc.aio.ServicerContext, fn: Any, *args: Any) -> Any:
        async with invalid_fields_refused(context):
            return fn(*args)

    async def _written_job(
        self, context: grpc.aio.ServicerContext, request_id: str, subject: str, job_id: str
    ) -> JobRecord:
        """The job ``job_id`` a write just submitted or updated; a reused request id if the log
        answered the id for another job (``subject``, the one the write recorded)."""
        job = self.replica.state.jobs.get(job_id) if subject == job_id else None
        if job is None:
            await self._reused_request_id(context, request_id)
        return job

    async def _written_machine(
        self, context: grpc.aio.ServicerContext, request_id: str, machine_id: str
    ) -> machine_pb2.Machine:
        """The machine a write just registered or changed, as the API shows it; a reused
        request id if the log answered the id for another machine."""
        state = self.replica.state
        machine = state.machines.get(machine_id)
        if machine is None:
            await self._reused_request_id(context, request_id)
        return statuses.machine_out(state, machine, self.replica.soft, self.replica.view.reservation)

    # ------------------------------------------------------------------ jobs
    async def SubmitJob(  # noqa: N802
        self, request: borgmaster_pb2.SubmitJobRequest, context: grpc.aio.ServicerContext
    ) -> borgmaster_pb2.SubmitJobResponse:
        spec = await self._convert_or_abort(context, specs.job_spec_in, request.spec, "spec")
        command = SubmitJob(request.request_id, spec, payload_digest=specs.payload_digest(request))
        result, seq = await self._write(command, context)
        job = await self._written_job(context, request.request_id, result.subject, f"{spec.user}/{spec.name}")
        return borgmaster_pb2.SubmitJobResponse(
            job_id=job.job_id,
            state=specs.enum_out(state_pb2.JobState, job.state),
            spec_version=job.spec_version,
            log_sequence=seq,
        )

    async def UpdateJob(  # noqa: N802
        self, request: borgmaster_pb2.UpdateJobRequest, context: grpc.aio.ServicerContext
    ) -> borgmaster_pb2.UpdateJobResponse:
        spec = await self._convert_or_abort(context, specs.job_spec_in, request.spec, "spec")
        command = UpdateJob(
            request.request_id,
            request.job_id,
            spec,
            tuple(request.update_mask.paths),
            request.expected_spec_version,
            request.fencing_token,
            request.release_hold,
            request.policy.max_disruptions,
            payload_digest=specs.payload_digest(request),
        )
        result, seq = await self._write(command, context)
        job = await self._written_job(context, request.request_id, result.subject, request.job_id)
        return borgmaster_pb2.UpdateJobResponse(job=statuses.job_status_out(job), log_sequence=seq)

    async def KillJob(  # noqa: N802
        self, request: borgmaster_pb2.KillJobRequest, context: grpc.aio.ServicerContext
    ) -> borgmaster_pb2.KillJobResponse:
        command = KillJob(request.request_id, request.job_id, payload_digest=specs.payload_digest(request))
        _, seq = await self._write(command, context)
        return borgmaster_pb2.KillJobResponse(log_sequence=seq)

    async def GetJob(  # noqa: N802
        self, request: borgmaster_pb2.GetJobRequest, context: grpc.aio.ServicerContext
    ) -> borgmaster_pb2.GetJobResponse:
        if request.include_tasks:
            await self._soft_state_read(context)
        else:
            self._name_the_master(context)
        job = self.replica.state.job(request.job_id)
        if job is None:
            await abort(context, grpc.StatusCode.NOT_FOUND, f"job_id: no job {request.job_id!r}")
        reservations = {}
        if request.include_tasks:
            for task in job.visible_tasks():
                reservation = self.replica.view.reservation(job.job_id, task.index)
                if reservation is not None:
                    reservations[task.key] = reservation
        status = statuses.job_status_out(job, request.include_tasks, self.replica.soft, reservations)
        return borgmaster_pb2.GetJobResponse(job=status)

    async def ListJobs(  # noqa: N802
        self, request: borgmaster_pb2.ListJobsRequest, context: grpc.aio.ServicerContext
    ) -> borgmaster_pb2.ListJobsResponse:
        self._name_the_master(context)
        async with invalid_fields_refused(context):
            size, after = requested_page(request, DEFAULT_JOBS_PAGE, MAX_PAGE, str, "")
            states = {specs.enum_in(JobState, state_pb2.JobState, s, "states") for s in request.states}
            band = specs.enum_in(PriorityBand, job_pb2.PriorityBand, request.band, "band")

        def listed(job: JobRecord) -> bool:
            spec = job.spec
            return not (
                (request.user and spec.user != request.user)
                or not spec.name.startswith(request.name_prefix)
                or (states and job.state not in states)
                or (band is not PriorityBand.UNSPECIFIED and spec.effective_band is not band)
                or (request.autopilot_only and not spec.autopilot.active)
            )

        jobs = self.replica.state.jobs
        page, token = first_page(
            ((job_id, jobs[job_id]) for job_id in sorted(jobs) if job_id > after and listed(jobs[job_id])),
            size,
        )
        return borgmaster_pb2.ListJobsResponse(
            jobs=[statuses.job_status_out(job) for job in page], next_page_token=token
        )

    async def GetTask(  # noqa: N802
        self, request: borgmaster_pb2.GetTaskRequest, context: grpc.aio.ServicerContext
    ) -> borgmaster_pb2.GetTaskResponse:
        await self._soft_state_read(context)
        job = self.replica.state.job(request.job_id)
        task = None if job is None else job.tasks.get(request.task_index)
        if job is None or task is None or request.task_index >= job.spec.task_count:
            await abort(
                context,
                grpc.StatusCode.NOT_FOUND,
                f"task_index: no task {request.job_id}/{request.task_index}",
            )
        reservation = self.replica.view.reservation(job.job_id, task.index)
        events = self.replica.core.task_events.get(task.key, ())
        return borgmaster_pb2.GetTaskResponse(
            task=statuses.task_status_out(job, task, self.replica.soft, reservation),
            recent_events=[statuses.task_change_out(e) for e in events],
        )

    async def WhyPending(  # noqa: N802
        self, request: borgmaster_pb2.WhyPendingRequest, context: grpc.aio.ServicerContext
    ) -> borgmaster_pb2.WhyPendingResponse:
        self._name_the_master(context)
        state = self.replica.state
        job = state.job(request.job_id)
        if job is None:
            await abort(context, grpc.StatusCode.NOT_FOUND, f"job_id: no job {request.job_id!r}")
        if request.HasField("task_index"):
            index = request.task_index
            if index not in job.tasks or index >= job.spec.task_count:
                await abort(context, grpc.StatusCode.NOT_FOUND, f"task_index: no task {index}")
        else:
            pending = [t.index for t in job.visible_tasks() if t.state is TaskState.PENDING]
            index = pending[0] if pending else 0
        report = explain(self.replica.view, state, job.job_id, index, self.replica.event_now_ms())
        lifetime = self.lifetimes.lifetime_of(state, job.job_id, index)
        response = statuses.pending_report_out(report)
        response.lifetime.CopyFrom(lifetimes.task_lifetime_out(lifetime))
        return response

    # ------------------------------------------------------------------ machines
    async def ListMachines(  # noqa: N802
        self, request: borgmaster_pb2.ListMachinesRequest, context: grpc.aio.ServicerContext
    ) -> borgmaster_pb2.ListMachinesResponse:
        await self._soft_state_read(context)
        async with invalid_fields_refused(context):
            size, after = requested_page(request, DEFAULT_MACHINES_PAGE, MAX_PAGE, str, "")
            states = {
                specs.enum_in(MachineAvailability, machine_pb2.MachineState, s, "states")
                for s in request.states
            }

        def listed(machine: MachineRecord) -> bool:
            return not (
                (states and machine.availability not in states)
                or (request.rack and machine.spec.rack != request.rack)
            )

        state = self.replica.state
        machines = state.machines
        page, token = first_page(
            (
                (machine_id, machines[machine_id])
                for machine_id in sorted(machines)
                if machine_id > after and listed(machines[machine_id])
            ),
            size,
        )
        return borgmaster_pb2.ListMachinesResponse(
            machines=[
                statuses.machine_out(state, machine, self.replica.soft, self.replica.view.reservation)
                for machine in page
            ],
            next_page_token=token,
        )

    async def RegisterMachine(  # noqa: N802
        self, request: borgmaster_pb2.RegisterMachineRequest, context: grpc.aio.ServicerContext
    ) -> borgmaster_pb2.RegisterMachineResponse:
        spec = await self._convert_or_abort(context, specs.machine_spec_in, request.spec, "spec")
        command = RegisterMachine(request.request_id, spec, payload_digest=specs.payload_digest(request))
        _, seq = await self._write(command, context)
        machine = await self._written_machine(context, request.request_id, spec.machine_id)
        return borgmaster_pb2.RegisterMachineResponse(machine=machine, log_sequence=seq)

    async def SetMachineState(  # noqa: N802
        self, request: borgmaster_pb2.SetMachineStateRequest, context: grpc.aio.ServicerContext
    ) -> borgmaster_pb2.SetMachineStateResponse:
        target = await self._convert_or_abort(
            context, specs.enum_in, MachineAvailability, machine_pb2.MachineState, request.state, "state"
        )
        command = SetMachineState(
            request.request_id,
            request.machine_id,
            target,
            request.detail,
            payload_digest=specs.payload_digest(request),
        )
        _, seq = await self._write(command, context)
        machine = await self._written_machine(context, request.request_id, request.machine_id)
        return borgmaster_pb2.SetMachineStateResponse(machine=machine, log_sequence=seq)

    # ------------------------------------------------------------------ quota and leadership
    async def GetQuota(  # noqa: N802
        self, request: borgmaster_pb2.GetQuotaRequest, context: grpc.aio.ServicerContext
    ) -> borgmaster_pb2.GetQuotaResponse:
        self._name_the_master(context)
        state = self.replica.state
        keys = sorted(
            ((u, b) for u, b in state.quotas if not request.user or u == request.user),
            key=lambda k: (k[0], k[1].value),
        )
        return borgmaster_pb2.GetQuotaResponse(quotas=[statuses.quota_out(state, u, b) for u, b in keys])

    async def SetQuota(  # noqa: N802
        self, request: borgmaster_pb2.SetQuotaRequest, context: grpc.aio.ServicerContext
    ) -> borgmaster_pb2.SetQuotaResponse:
        band = await self._convert_or_abort(
            context, specs.enum_in, PriorityBand, job_pb2.PriorityBand, request.band, "band"
        )
        if band is PriorityBand.UNSPECIFIED:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "band: name the priority band")
        limit = await self._convert_or_abort(context, specs.resources_in, request.limit, "limit")
        command = SetQuota(
            request.request_id, request.user, band, limit, payload_digest=specs.payload_digest(request)
        )
        _, seq = await self._write(command, context)
        return borgmaster_pb2.SetQuotaResponse(
            quota=statuses.quota_out(self.replica.state, request.user, band), log_sequence=seq
        )

    async def GetLeader(  # noqa: N802
        self, request: borgmaster_pb2.GetLeaderRequest, context: grpc.aio.ServicerContext
    ) -> borgmaster_pb2.GetLeaderResponse:
        replica = self.replica
        response = borgmaster_pb2.GetLeaderResponse(
            replica_id=replica.replica_id, is_leader=replica.is_leader
        )
        leader = replica.known_leader
        if replica.is_leader:
            response.leader.CopyFrom(
                state_pb2.LeaderInfo(
                    replica_id=replica.replica_id, address=replica.address, epoch=replica.epoch
                )
            )
        elif leader is not None:
            response.leader.CopyFrom(
                state_pb2.LeaderInfo(replica_id=leader.holder, address=leader.address, epoch=leader.token)
            )
        if response.HasField("leader"):
            response.leader.log_sequence = replica.state.last_sequence
        return response

    async def GetCellStatus(  # noqa: N802
        self, request: borgmaster_pb2.GetCellStatusRequest, context: grpc.aio.ServicerContext
    ) -> borgmaster_pb2.GetCellStatusResponse:
        """The GPA fit test's rho next to the overflow the master's polls observed (GPA §4, §5)."""
        self._name_the_master(context)  # the counts are the master's soft state
        replica = self.replica
        view = replica.view
        counts = view.cpu_overflow.counts()
        proposals = replica.core.proposals
        return borgmaster_pb2.GetCellStatusResponse(
            proposals=proposals.proposals,
            placements_accepted=proposals.accepted,
            placements_stale=proposals.stale,
            placements_preempted=proposals.preempted,
            stale_reasons=proposals.stale_reasons,
            log_sequence=replica.state.last_sequence,
            tasks_pending=replica.state.schedulable_pending_count(),
            replica_id=replica.replica_id,
            is_leader=replica.is_leader,
            gpa_rho=view.profile.resource_fit.gpa_rho,
            tasks_running=view.tasks_running(),
            tasks_with_cpu_stats=len(view.cpu_stats()),
            machines_in_use=view.machines_in_use(),
            machine_samples=counts.machine_samples,
            overflowed_samples=counts.overflowed_samples,
            recent_overflow_rate=counts.recent_rate,
            recent_samples=counts.recent_samples,
        )

    # ------------------------------------------------------------------ lifetimes (LAVA §3-4)
    async def TrainLifetimes(  # noqa: N802
        self, request: lifetimes_pb2.TrainLifetimesRequest, context: grpc.aio.ServicerContext
    ) -> lifetimes_pb2.TrainLifetimesResponse:
        if request.min_runs < 0:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "min_runs: must be >= 0")
        cause = request.request_id or f"req-{uuid.uuid4().hex[:12]}"
        try:
            outcome = await self.lifetimes.train(request.min_runs, cause)
        except NotLeader as error:
            await self._no_master_here(context, error)
        except StoreUnavailable as error:
            await abort(context, grpc.StatusCode.UNAVAILABLE, f"{error}; retry")
        if isinstance(outcome, TooLittleHistory):
            await abort(context, grpc.StatusCode.FAILED_PRECONDITION, str(outcome))
        trained = outcome.trained
        return lifetimes_pb2.TrainLifetimesResponse(
            runs=trained.runs,
            jobs=trained.jobs,
            log_sequence=outcome.log_sequence,
            model_bytes=outcome.model_bytes,
            median_lifetime_s=trained.median_lifetime_s,
            runs_per_class=list(trained.runs_per_class),
        )

    async def DrainMachine(  # noqa: N802
        self, request: lifetimes_pb2.DrainMachineRequest, context: grpc.aio.ServicerContext
    ) -> lifetimes_pb2.DrainMachineResponse:
        if not request.machine_id:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "machine_id: name the machine to drain")
        command = SetMachineState(
            request.request_id,
            request.machine_id,
            MachineAvailability.DRAINING,
            request.detail or "drained by an operator",
            payload_digest=specs.payload_digest(request),
        )
        _, seq = await self._write(command, context)
        plan = self.lifetimes.drain_plan(self.replica.state, request.machine_id)
        return lifetimes.drain_plan_out(request.machine_id, seq, plan)

    async def GetLifetimes(  # noqa: N802
        self, request: lifetimes_pb2.GetLifetimesRequest, context: grpc.aio.ServicerContext
    ) -> lifetimes_pb2.GetLifetimesResponse:
        """Answered from the replicated state (host states, model); predictions are the master's."""
        self._name_the_master(context)
        state = self.replica.state
        model = state.lifetime_model
        return lifetimes_pb2.GetLifetimesResponse(
            placement_policy=self.lifetimes.settings.placement_policy,
            model_loaded=model is not None,
            model_runs=model.runs if model else 0,
            model_trained_at_ms=model.trained_at_ms if model else 0,
            hosts=[lifetimes.lava_host_out(h) for _, h in sorted(state.lava_hosts.items())],
            tasks_predicted=self.lifetimes.tasks_predicted,
        )
