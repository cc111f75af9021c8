"""The Borgmaster's lifetime-aware RPCs (``TrainLifetimes``, ``DrainMachine``, ``GetLifetimes``).

A mixin of :class:`~cellpilot_services.borgmaster.servicer.BorgmasterServicer`, sharing its
plumbing (the write path, refusals, redirects to the master); the work is done by
:class:`~cellpilot_services.borgmaster.lifetime_keeper.LifetimeKeeper` and the core.
"""

from __future__ import annotations

import uuid
from typing import Any, NoReturn, Protocol

import grpc

from cellpilot.api.v1 import lifetimes_pb2
from cellpilot.borg.decisions import Command, SetMachineState
from cellpilot.borg.model import MachineAvailability
from cellpilot.borg.task_lifetimes import TooLittleHistory
from cellpilot.platform.request_validation import abort
from cellpilot.platform.store_outage import StoreUnavailable
from cellpilot_services.borgmaster import convert, lifetime_convert
from cellpilot_services.borgmaster.lifetime_keeper import LifetimeKeeper
from cellpilot_services.borgmaster.replica import NotLeader, Replica


class _Servicer(Protocol):
    replica: Replica
    lifetimes: LifetimeKeeper

    async def _write(self, command: Command, context: grpc.aio.ServicerContext) -> tuple[Any, int]: ...

    async def _no_master_here(self, context: grpc.aio.ServicerContext, error: NotLeader) -> NoReturn: ...

    def _name_the_master(self, context: grpc.aio.ServicerContext) -> None: ...


class LifetimeRpcs:
    async def TrainLifetimes(  # noqa: N802
        self: _Servicer, request: lifetimes_pb2.TrainLifetimesRequest, context: grpc.aio.ServicerContext
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
        self: _Servicer, request: lifetimes_pb2.DrainMachineRequest, context: grpc.aio.ServicerContext
    ) -> lifetimes_pb2.DrainMachineResponse:
        if not request.machine_id:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "machine_id: name the machine to drain")
        command = SetMachineState(
            request.request_id,
            request.machine_id,
            MachineAvailability.DRAINING,
            request.detail or "drained by an operator",
            payload_digest=convert.payload_digest(request),
        )
        _, seq = await self._write(command, context)
        async with self.replica.lock:
            plan = self.lifetimes.drain_plan(self.replica.state, request.machine_id)
        return lifetime_convert.drain_plan_out(request.machine_id, seq, plan)

    async def GetLifetimes(  # noqa: N802
        self: _Servicer, request: lifetimes_pb2.GetLifetimesRequest, context: grpc.aio.ServicerContext
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
            hosts=[lifetime_convert.lava_host_out(h) for _, h in sorted(state.lava_hosts.items())],
            tasks_predicted=len(self.lifetimes.tracker.predicted),
        )
