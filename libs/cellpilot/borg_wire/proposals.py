"""A scheduler's proposals and the master's soft-state feed on the wire (``scheduler.proto``, Borg §3.4).

Both ends convert here: the scheduler sends :func:`proposal_out` and reads :func:`verdict_in`
and :func:`soft_state_in`; the master reads :func:`proposal_in` (raising :class:`InvalidField`
naming the field) and answers :func:`verdict_out` and :func:`soft_state_out`.
"""

from __future__ import annotations

from cellpilot.api.v1 import scheduler_pb2
from cellpilot.borg.proposals import PlacementProposal, ProposalVerdict, ProposedPlacement, Refusal
from cellpilot.borg.soft_feed import TaskSoftState
from cellpilot.borg_wire.lifetimes import hosts_changed_in, hosts_changed_out
from cellpilot.borg_wire.specs import resources_in, resources_out, same_named
from cellpilot.platform.request_validation import InvalidField

PLACEMENT_FIELDS = ("job_id", "task_index", "incarnation", "spec_version", "machine_id")


def proposal_out(proposal: PlacementProposal) -> scheduler_pb2.ProposePlacementsRequest:
    request = scheduler_pb2.ProposePlacementsRequest(
        scheduler_id=proposal.scheduler_id,
        master_epoch=proposal.epoch,
        based_on_sequence=proposal.based_on_seq,
        placements=[
            scheduler_pb2.ProposedPlacement(**same_named(p, PLACEMENT_FIELDS)) for p in proposal.placements
        ],
    )
    if proposal.lava_hosts is not None:
        request.lava_hosts.CopyFrom(hosts_changed_out(proposal.lava_hosts))
    return request


def proposal_in(request: scheduler_pb2.ProposePlacementsRequest) -> PlacementProposal:
    if not request.scheduler_id:
        raise InvalidField("scheduler_id", "must not be empty")
    placements = []
    for i, p in enumerate(request.placements):
        if not p.job_id or not p.machine_id or p.task_index < 0 or p.incarnation < 0:
            raise InvalidField(f"placements[{i}]", "needs a job_id, a task_index >= 0 and a machine_id")
        placements.append(ProposedPlacement(**same_named(p, PLACEMENT_FIELDS)))
    hosts = hosts_changed_in(request.lava_hosts) if request.HasField("lava_hosts") else None
    return PlacementProposal(
        request.scheduler_id, request.master_epoch, request.based_on_sequence, tuple(placements), hosts
    )


def verdict_out(
    verdict: ProposalVerdict, epoch: int, log_sequence: int
) -> scheduler_pb2.ProposePlacementsResponse:
    return scheduler_pb2.ProposePlacementsResponse(
        master_epoch=epoch,
        log_sequence=log_sequence,
        accepted=len(verdict.accepted),
        refused=[
            scheduler_pb2.RefusedPlacement(job_id=r.key[0], task_index=r.key[1], reason=r.reason)
            for r in verdict.refused
        ],
        preempted=verdict.preempted,
    )


def refusals_in(response: scheduler_pb2.ProposePlacementsResponse) -> tuple[Refusal, ...]:
    return tuple(Refusal((r.job_id, r.task_index), r.reason) for r in response.refused)


def soft_state_out(
    entries: list[TaskSoftState], epoch: int, version: int, event_time_ms: int, log_sequence: int
) -> scheduler_pb2.GetSoftStateResponse:
    return scheduler_pb2.GetSoftStateResponse(
        master_epoch=epoch,
        version=version,
        event_time_ms=event_time_ms,
        log_sequence=log_sequence,
        tasks=[
            scheduler_pb2.TaskSoftState(
                job_id=e.key[0],
                task_index=e.key[1],
                reservation=resources_out(e.reservation),
                has_cpu_moments=e.cpu is not None,
                cpu_mean_millicores=e.cpu[0] if e.cpu else 0.0,
                cpu_std_millicores=e.cpu[1] if e.cpu else 0.0,
            )
            for e in entries
        ],
    )


def soft_state_in(response: scheduler_pb2.GetSoftStateResponse) -> list[TaskSoftState]:
    return [
        TaskSoftState(
            (t.job_id, t.task_index),
            resources_in(t.reservation, "tasks.reservation"),
            (t.cpu_mean_millicores, t.cpu_std_millicores) if t.has_cpu_moments else None,
        )
        for t in response.tasks
    ]
