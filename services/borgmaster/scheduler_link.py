"""The master's side of its schedulers (``scheduler.proto``, Borg §3.4): soft state out, proposals in.

A scheduler runs in a process of its own on a cached copy of the cell. It asks the master for
the soft state its copy cannot get from the log (``GetSoftState``: reservations, CPU moments,
the cell's event time) and proposes placements (``ProposePlacements``), which go to the core as
a :class:`cellpilot.borg.proposals.PlacementProposal` through the master's one queue: each
placement still appropriate is committed, the stale ones are answered so the scheduler
reconsiders them. Only the master answers; a follower names it like for a write.
"""

from __future__ import annotations

import logging
from typing import NoReturn

import grpc

from cellpilot.api.v1 import scheduler_pb2, scheduler_pb2_grpc
from cellpilot.borg.proposals import ProposalVerdict
from cellpilot.borg_wire.proposals import proposal_in, soft_state_out, verdict_out
from cellpilot.platform import error_reasons
from cellpilot.platform.request_validation import abort, invalid_fields_refused
from cellpilot.platform.store_outage import StoreUnavailable
from cellpilot_services.borgmaster.replica import NotLeader, Replica

log = logging.getLogger(__name__)


class SchedulerLinkServicer(scheduler_pb2_grpc.SchedulerLinkServicer):
    def __init__(self, replica: Replica) -> None:
        self.replica = replica

    async def _not_here(self, context: grpc.aio.ServicerContext, error: NotLeader | None = None) -> NoReturn:
        leader = (error.leader if error else None) or self.replica.leader_address() or ""
        if leader and leader != self.replica.address:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"not the elected master; the master is {leader}",
                trailing_metadata=(
                    (error_reasons.LEADER_METADATA_KEY, leader),
                    *error_reasons.reason_metadata(error_reasons.NOT_MASTER),
                ),
            )
        await abort(
            context, grpc.StatusCode.UNAVAILABLE, "no elected master at the moment", error_reasons.NO_MASTER
        )
        raise AssertionError("unreachable")  # pragma: no cover

    async def GetSoftState(  # noqa: N802
        self, request: scheduler_pb2.GetSoftStateRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.GetSoftStateResponse:
        replica = self.replica
        if not replica.is_leader:
            await self._not_here(context)
        since = request.since_version if request.master_epoch == replica.epoch else 0
        view = replica.view
        return soft_state_out(
            view.soft_changes(since),
            replica.epoch,
            view.feed.version,
            replica.event_now_ms(),
            replica.state.last_sequence,
        )

    async def ProposePlacements(  # noqa: N802
        self, request: scheduler_pb2.ProposePlacementsRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.ProposePlacementsResponse:
        replica = self.replica
        if not replica.is_leader:
            await self._not_here(context)
        async with invalid_fields_refused(context):
            proposal = proposal_in(request)
        try:
            verdict, _ = await replica.submit(proposal)
        except NotLeader as error:
            await self._not_here(context, error)
        except StoreUnavailable as error:
            await abort(context, grpc.StatusCode.UNAVAILABLE, str(error), error_reasons.STORE_UNAVAILABLE)
        assert isinstance(verdict, ProposalVerdict)
        if verdict.refused:
            log.info(
                "stale placements refused",
                extra={
                    "scheduler_id": proposal.scheduler_id,
                    "accepted": len(verdict.accepted),
                    "stale": len(verdict.refused),
                    "example": verdict.refused[0].reason,
                },
            )
        return verdict_out(verdict, replica.epoch, replica.state.last_sequence)
