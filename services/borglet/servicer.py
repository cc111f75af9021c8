"""The Borglet gRPC API (``borglet.proto``): Poll, StartTask, StopTask, UpdateTask.

Every call names the machine (a fleet-mode Borglet routes by it: NOT_FOUND for a machine it
does not host) and carries the master's epoch: an epoch older than the newest the machine
has seen is refused with FAILED_PRECONDITION, so a deposed master cannot command it.
Bad input is INVALID_ARGUMENT naming the field, and changes nothing — except in a poll's
desired set, where a task the Borglet cannot run fails alone (reported FAILED with the
reason) and the poll answers for the rest of the machine.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry import trace

from cellpilot.api.v1 import borglet_pb2, borglet_pb2_grpc
from cellpilot.borglet.hosted_task import HostedTask
from cellpilot.borglet.machine_agent import MachineAgent
from cellpilot.borglet.task_lifecycle import Phase
from cellpilot.platform.request_validation import abort, invalid_fields_refused
from cellpilot_services.borglet import convert
from cellpilot_services.borglet.convert import RuntimeDefaults
from cellpilot_services.borglet.fleet import Fleet, StaleIncarnationError

log = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)


def _traced(name: str, machine_id: str, cause_id: str) -> Any:
    """A span for one call, carrying the machine and the cause id (docs/architecture.md rule 4)."""
    return tracer.start_as_current_span(
        f"Borglet.{name}", attributes={"cellpilot.machine_id": machine_id, "cellpilot.cause_id": cause_id}
    )


@dataclass(frozen=True)
class _Refused:
    code: grpc.StatusCode
    message: str


class BorgletServicer(borglet_pb2_grpc.BorgletServicer):
    def __init__(self, fleet: Fleet, defaults: RuntimeDefaults) -> None:
        self.fleet = fleet
        self.defaults = defaults

    def _admit(self, machine_id: str, epoch: int) -> MachineAgent | _Refused:
        """The hosted machine, if the call may command it; else why not (the status to fail with)."""
        machine = self.fleet.machines.get(machine_id)
        if machine is None:
            if not machine_id:
                return _Refused(grpc.StatusCode.INVALID_ARGUMENT, "machine_id: must not be empty")
            return _Refused(grpc.StatusCode.NOT_FOUND, f"machine_id: {machine_id!r} is not hosted here")
        refusal = machine.admit_epoch(epoch)
        if refusal is not None:
            log.warning(
                "refused a call from a deposed master", extra={"machine_id": machine_id, "epoch": epoch}
            )
            return _Refused(grpc.StatusCode.FAILED_PRECONDITION, f"master_epoch: {refusal}")
        return machine

    @asynccontextmanager
    async def _commanding(
        self, rpc: str, request: Any, cause: str, context: Any
    ) -> AsyncIterator[MachineAgent]:
        """Inside the call's span, the machine the call names, if it may command it (else the
        call ends refused)."""
        with _traced(rpc, request.machine_id, cause):
            admitted = self._admit(request.machine_id, request.master_epoch)
            if isinstance(admitted, _Refused):
                await abort(context, admitted.code, admitted.message)
            yield admitted

    def _report(self, record: HostedTask) -> borglet_pb2.TaskReport:
        return convert.task_report(record, self.fleet.clock.now_ms())

    async def Poll(  # noqa: N802
        self, request: borglet_pb2.PollRequest, context: Any
    ) -> borglet_pb2.PollResponse:
        cause = f"poll:{request.master_replica_id}:{request.master_epoch}:{request.desired.version}"
        async with self._commanding("Poll", request, cause, context) as machine:
            return await self._answer(machine, request, cause)

    async def PollMachines(  # noqa: N802
        self, request: borglet_pb2.PollMachinesRequest, context: Any
    ) -> borglet_pb2.PollMachinesResponse:
        """Every poll of the batch answered as Poll answers it alone; a refused one does not
        stop the others (Borg §3.3: one machine's trouble never hides another's report)."""
        response = borglet_pb2.PollMachinesResponse()
        with tracer.start_as_current_span(
            "Borglet.PollMachines", attributes={"cellpilot.machines": len(request.polls)}
        ):
            for poll in request.polls:
                cause = f"poll:{poll.master_replica_id}:{poll.master_epoch}:{poll.desired.version}"
                admitted = self._admit(poll.machine_id, poll.master_epoch)
                if isinstance(admitted, _Refused):
                    response.refusals.append(
                        borglet_pb2.PollRefusal(
                            machine_id=poll.machine_id, code=admitted.code.value[0], message=admitted.message
                        )
                    )
                    continue
                response.responses.append(await self._answer(admitted, poll, cause))
        return response

    async def _answer(
        self, machine: MachineAgent, request: borglet_pb2.PollRequest, cause: str
    ) -> borglet_pb2.PollResponse:
        if request.HasField("desired") and request.desired.version < machine.desired_version:
            # Versions are log positions, so they only grow: an older set comes from a link
            # shard whose copy of the state lags behind the one that sent ours (Borg §3.3).
            log.debug(
                "ignored an older desired set",
                extra={
                    "cause_id": cause,
                    "machine_id": machine.machine_id,
                    "version": request.desired.version,
                },
            )
        elif request.HasField("desired"):
            # A task that cannot be read fails alone (reported FAILED); the poll still answers,
            # so one bad task never makes its machine look down (Borg §3.3).
            desired = convert.desired_plans(request.desired, self.defaults)
            for problem in desired.skipped:
                log.warning(
                    "desired task skipped: it names no task to report on",
                    extra={"cause_id": cause, "machine_id": machine.machine_id, "error": problem},
                )
            await self.fleet.apply_desired(machine, request.desired.version, list(desired.plans), cause)
        machine.acknowledge(request.ack_event_sequence)
        machine.forget_settled()
        return convert.poll_response(
            machine_id=machine.machine_id,
            now_ms=self.fleet.clock.now_ms(),
            desired_version=machine.desired_version,
            records=list(machine.tasks.values()),
            events=list(machine.events),
            capacity=machine.profile.capacity,
            memory_pressure=machine.memory_pressure,
            packages=machine.packages,
        )

    async def StartTask(  # noqa: N802
        self, request: borglet_pb2.StartTaskRequest, context: Any
    ) -> borglet_pb2.StartTaskResponse:
        async with self._commanding("StartTask", request, request.request_id, context) as machine:
            if not request.HasField("task"):
                await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "task: required")
            async with invalid_fields_refused(context):
                plan = convert.task_plan(request.task, "task", self.defaults)
            try:
                record = await self.fleet.start_task(
                    machine, plan, request.request_id or f"start:{plan.name}"
                )
            except StaleIncarnationError as error:
                await abort(context, grpc.StatusCode.FAILED_PRECONDITION, f"task.incarnation: {error}")
            return borglet_pb2.StartTaskResponse(task=self._report(record))

    async def _task(
        self, machine: MachineAgent, job_id: str, task_index: int, incarnation: int, context: Any
    ) -> HostedTask:
        record = machine.tasks.get((job_id, task_index))
        if record is None:
            await abort(
                context,
                grpc.StatusCode.NOT_FOUND,
                f"task {job_id}/{task_index} is not on {machine.machine_id}",
            )
        if record.plan.incarnation != incarnation:
            await abort(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                f"incarnation: {job_id}/{task_index} runs incarnation {record.plan.incarnation} here, "
                f"not {incarnation}",
            )
        return record

    async def StopTask(  # noqa: N802
        self, request: borglet_pb2.StopTaskRequest, context: Any
    ) -> borglet_pb2.StopTaskResponse:
        async with self._commanding("StopTask", request, request.request_id, context) as machine:
            kind = convert.STOP_REASONS.get(request.reason)
            if kind is None:
                await abort(
                    context, grpc.StatusCode.INVALID_ARGUMENT, "reason: must be KILLED, PREEMPTED or EVICTED"
                )
            if request.grace_period_seconds < 0:
                await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "grace_period_seconds: must be >= 0")
            record = await self._task(
                machine, request.job_id, request.task_index, request.incarnation, context
            )
            cause = request.request_id or f"stop:{record.plan.name}"
            await self.fleet.stop_task(machine, record, kind, float(request.grace_period_seconds), cause)
            return borglet_pb2.StopTaskResponse(task=self._report(record))

    async def UpdateTask(  # noqa: N802
        self, request: borglet_pb2.UpdateTaskRequest, context: Any
    ) -> borglet_pb2.UpdateTaskResponse:
        async with self._commanding("UpdateTask", request, request.request_id, context) as machine:
            async with invalid_fields_refused(context):
                limits = convert.limits(request.limits, "limits")
                hard = convert.hard_memory_limit(request.memory_limit_kind, "memory_limit_kind")
            record = await self._task(
                machine, request.job_id, request.task_index, request.incarnation, context
            )
            if record.phase in (Phase.DEAD, Phase.STOPPING):
                await abort(
                    context, grpc.StatusCode.FAILED_PRECONDITION, f"task {record.plan.name} is not running"
                )
            self.fleet.update_task(record, limits, hard, request.priority, request.spec_version)
            log.info(
                "task updated in place",
                extra={
                    "cause_id": request.request_id,
                    "task": record.plan.name,
                    "machine_id": machine.machine_id,
                },
            )
            return borglet_pb2.UpdateTaskResponse(task=self._report(record))
