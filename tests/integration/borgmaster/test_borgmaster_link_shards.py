"""Link shards (Borg §3.3) on the embedded stack: three replicas share the polling of a fleet;
a standby's shard forwards the reports of its machines and the master applies them; when a
replica dies its machines are re-partitioned over the others; a report for another epoch is
refused."""

from __future__ import annotations

import uuid

import grpc
import pytest
from borgmaster_harness import borglet, eventually, grant, leader_of, replicas, simulated_job, stub
from stack_security import service_channel

from cellpilot.api.v1 import borgmaster_pb2, link_shard_pb2, link_shard_pb2_grpc
from cellpilot.borg.link_shards import shard_owner
from cellpilot.stack import StackEndpoints

MACHINES = 12
CPU = 6000  # of the harness Borglet machines' 8000: one such task per machine


async def _started_machines(master: object, job_id: str) -> set[str] | None:
    state = master.replica.state  # type: ignore[attr-defined]
    job = state.job(job_id)
    tasks = [t for j, t in state.iter_tasks() if j.job_id == job_id] if job else []
    if not tasks or not all(t.started for t in tasks):
        return None
    return {t.machine_id for t in tasks}


async def test_standby_shards_report_and_a_dead_replicas_machines_move(
    fresh_database_url: str, endpoints: StackEndpoints
) -> None:
    user = f"u{uuid.uuid4().hex[:6]}"
    async with replicas(fresh_database_url, endpoints, 3, link_shard_member_timeout_s=2.0) as masters:
        leader = await leader_of(masters)
        standbys = [m for m in masters if m is not leader]
        async with borglet(endpoints, [m.address for m in masters], fleet_size=MACHINES):
            channel, client = stub(leader.address)
            async with channel:

                async def three_shards() -> bool:
                    membership = leader.registry.current()
                    return len(membership.members) == 3 and len(leader.replica.state.machines) == MACHINES

                await eventually(three_shards, 30, "three link shards and every machine registered")
                members = leader.registry.current().members
                machines = sorted(leader.replica.state.machines)
                # The leader's own shard does not poll a standby's machines.
                assert set(leader.link_shard.share()) == {
                    m for m in machines if shard_owner(m, members) == leader.replica.replica_id
                }
                await grant(client, user, cores=1000)
                first = await client.SubmitJob(
                    borgmaster_pb2.SubmitJobRequest(
                        request_id=f"{user}-1", spec=simulated_job("wide", user=user, tasks=MACHINES, cpu=CPU)
                    )
                )
                placed = await eventually(
                    lambda: _started_machines(leader, first.job_id), 30, "every task reported running"
                )
                assert len(placed) == MACHINES  # one per machine: every shard's machines have one
                by_standby = {m for m in placed if shard_owner(m, members) != leader.replica.replica_id}
                assert by_standby, "no task landed on a standby's machine"
                # Their RUNNING came through a standby's shard, as differences only.
                status = leader.registry.status_out()
                reported = {s.replica_id: s for s in status.shards}
                for standby in standbys:
                    assert reported[standby.replica.replica_id].changed_reports > 0

                async def shares_cover_the_cell() -> bool:
                    # Each shard's own count of what it polled, as of its latest report.
                    return sum(s.machines for s in leader.registry.status_out().shards) == MACHINES

                await eventually(shares_cover_the_cell, 10, "the shards' shares covering every machine once")

                # A standby dies: after the member timeout its machines go to the others.
                dead = standbys[0]
                dead_id = dead.replica.replica_id
                orphaned = {m for m in machines if shard_owner(m, members) == dead_id}
                await dead.stop()

                async def repartitioned() -> bool:
                    membership = leader.registry.current()
                    return dead_id not in membership.members and len(membership.members) == 2

                await eventually(repartitioned, 30, "the dead replica dropped from the partition")
                survivors = leader.registry.current().members
                assert all(shard_owner(m, survivors) != dead_id for m in orphaned)
                # The orphaned machines are polled again: a second job's tasks there start.
                second = await client.SubmitJob(
                    borgmaster_pb2.SubmitJobRequest(
                        request_id=f"{user}-2",
                        spec=simulated_job("again", user=user, tasks=MACHINES, cpu=8000 - CPU),
                    )
                )
                placed_again = await eventually(
                    lambda: _started_machines(leader, second.job_id), 30, "the second job's tasks running"
                )
                assert orphaned & placed_again


async def test_a_report_for_another_epoch_is_refused(
    fresh_database_url: str, endpoints: StackEndpoints
) -> None:
    async with replicas(fresh_database_url, endpoints, 1) as (master,):
        await leader_of([master])
        async with service_channel(master.address, "borgmaster") as channel:
            shards = link_shard_pb2_grpc.LinkShardsStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await shards.ReportMachineChanges(
                    link_shard_pb2.ReportMachineChangesRequest(
                        replica_id="borgmaster-9", master_epoch=master.replica.epoch - 1
                    )
                )
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "master_epoch" in (refused.value.details() or "")
            accepted = await shards.ReportMachineChanges(
                link_shard_pb2.ReportMachineChangesRequest(
                    replica_id="borgmaster-9", master_epoch=master.replica.epoch
                )
            )
            assert "borgmaster-9" in accepted.members
