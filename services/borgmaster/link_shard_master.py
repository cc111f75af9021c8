"""The master's side of the link shards (Borg §3.3): who shares the polling, and their reports.

:class:`ShardRegistry` is the membership as the master of the current epoch sees it: itself,
and every replica whose shard reported within ``link_shard_member_timeout_s``. It starts
afresh with every election (Borg §3.3: "the partitioning is recalculated whenever a
Borgmaster election occurs"); a replica that stops reporting leaves it and its machines are
re-partitioned over the others. :class:`LinkShardsServicer` takes the shards' differences
(``ReportMachineChanges``): refused unless made for this master's epoch, then applied like
the master's own polls (:func:`poll_reports.apply_reports`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import grpc

from cellpilot.api.v1 import link_shard_pb2, link_shard_pb2_grpc
from cellpilot.borg.link_shards import Membership, next_membership
from cellpilot.platform.error_reasons import NO_MASTER, STORE_UNAVAILABLE
from cellpilot.platform.request_validation import abort
from cellpilot.platform.store_outage import StoreUnavailable
from cellpilot_services.borgmaster.poll_reports import apply_reports
from cellpilot_services.borgmaster.replica import NotLeader, Replica

log = logging.getLogger(__name__)


@dataclass
class ShardStatus:
    machines: int = 0
    last_cycle_s: float = 0.0
    cycles: int = 0
    changed_reports: int = 0
    heard_at: float = 0.0  # monotonic


class ShardRegistry:
    def __init__(self, replica: Replica) -> None:
        self.replica = replica
        self.epoch = -1
        self.membership = Membership(0, ())
        self.shards: dict[str, ShardStatus] = {}

    def current(self) -> Membership:
        """The membership now (for the master's epoch; reset by an election; members whose
        shard went quiet dropped)."""
        replica = self.replica
        if self.epoch != replica.epoch:
            self.epoch = replica.epoch
            self.shards = {}
            self.membership = Membership(1, (replica.replica_id,))
        heard = {member: s.heard_at for member, s in self.shards.items() if member != replica.replica_id}
        updated = next_membership(
            self.membership,
            replica.replica_id,
            heard,
            time.monotonic(),
            replica.settings.link_shard_member_timeout_s,
        )
        if updated is not self.membership:
            log.info(
                "link shards re-partitioned",
                extra={"members": list(updated.members), "version": updated.version, "epoch": self.epoch},
            )
            self.membership = updated
        return self.membership

    def heard(
        self, replica_id: str, machines: int, previous_cycle_s: float, changed: int, ends_full_cycle: bool
    ) -> None:
        self.current()  # an election since the last report starts a new registry first
        status = self.shards.setdefault(replica_id, ShardStatus())
        status.machines = machines
        status.last_cycle_s = previous_cycle_s
        status.cycles += int(ends_full_cycle)
        status.changed_reports += changed
        status.heard_at = time.monotonic()

    def status_out(self) -> link_shard_pb2.GetLinkShardsResponse:
        membership = self.current()
        now = time.monotonic()
        return link_shard_pb2.GetLinkShardsResponse(
            master_epoch=self.epoch,
            membership_version=membership.version,
            shards=[
                link_shard_pb2.LinkShardStatus(
                    replica_id=member,
                    machines=status.machines,
                    last_cycle_s=status.last_cycle_s,
                    cycles=status.cycles,
                    last_report_age_s=now - status.heard_at,
                    changed_reports=status.changed_reports,
                )
                for member in membership.members
                if (status := self.shards.get(member)) is not None
            ],
        )


class LinkShardsServicer(link_shard_pb2_grpc.LinkShardsServicer):
    def __init__(self, replica: Replica, registry: ShardRegistry) -> None:
        self.replica = replica
        self.registry = registry

    async def ReportMachineChanges(  # noqa: N802
        self, request: link_shard_pb2.ReportMachineChangesRequest, context: grpc.aio.ServicerContext
    ) -> link_shard_pb2.ReportMachineChangesResponse:
        replica = self.replica
        if not replica.is_leader:
            await abort(context, grpc.StatusCode.FAILED_PRECONDITION, "not the elected master", NO_MASTER)
        if request.master_epoch != replica.epoch:
            await abort(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                f"master_epoch: the shard polled for epoch {request.master_epoch}, "
                f"the master's is {replica.epoch}",
            )
        if not request.replica_id:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "replica_id: must not be empty")
        self.registry.heard(
            request.replica_id,
            request.machines_polled,
            request.previous_cycle_s,
            len(request.changed),
            request.ends_full_cycle,
        )
        membership = self.registry.current()
        # Misses are judged only from a shard that polled by the current partition: a machine
        # that just moved is not marked down on a former owner's word.
        current = request.membership_version == membership.version
        missed = {m.machine_id: m.in_a_row for m in request.missed} if current else None
        try:
            applied = await apply_reports(
                replica, list(request.changed), missed, f"shard-{request.replica_id}-{request.master_epoch}"
            )
        except NotLeader as error:
            await abort(context, grpc.StatusCode.FAILED_PRECONDITION, str(error), NO_MASTER)
        except StoreUnavailable as error:
            await abort(context, grpc.StatusCode.UNAVAILABLE, str(error), STORE_UNAVAILABLE)
        return link_shard_pb2.ReportMachineChangesResponse(
            master_epoch=replica.epoch,
            membership_version=membership.version,
            members=membership.members,
            resend_desired=sorted(applied.resend),
            mutations=applied.mutations,
        )

    async def GetLinkShards(  # noqa: N802
        self, request: link_shard_pb2.GetLinkShardsRequest, context: grpc.aio.ServicerContext
    ) -> link_shard_pb2.GetLinkShardsResponse:
        if not self.replica.is_leader:
            await abort(context, grpc.StatusCode.FAILED_PRECONDITION, "not the elected master", NO_MASTER)
        return self.registry.status_out()
