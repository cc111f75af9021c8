"""The Borgmaster gRPC API on in-process replicas: validation, quota, idempotency, followers, why pending."""

from __future__ import annotations

import grpc
import pytest
from borgmaster_harness import eventually, grant, leader_of, machine, replicas, simulated_job, stub
from google.protobuf.field_mask_pb2 import FieldMask

from cellpilot.api.v1 import borgmaster_pb2, job_pb2, resources_pb2, state_pb2
from cellpilot.stack import StackEndpoints


async def test_submit_validation_quota_idempotency_and_reads(
    fresh_database_url: str, endpoints: StackEndpoints
) -> None:
    async with replicas(fresh_database_url, endpoints, 1) as (master,):
        await leader_of([master])
        channel, client = stub(master.address)
        async with channel:
            await grant(client, "alice", cores=4, memory_gib=100)
            bad = simulated_job("web")
            bad.task.limits.memory_bytes = 0
            with pytest.raises(grpc.aio.AioRpcError) as invalid:
                await client.SubmitJob(borgmaster_pb2.SubmitJobRequest(request_id="r0", spec=bad))
            assert invalid.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "spec.task.limits.memory_bytes" in (invalid.value.details() or "")
            negative = simulated_job("web")
            negative.task.limits.cpu_millicores = -5
            with pytest.raises(grpc.aio.AioRpcError) as neg:
                await client.SubmitJob(borgmaster_pb2.SubmitJobRequest(request_id="r0", spec=negative))
            assert "spec.task.limits.cpu_millicores" in (neg.value.details() or "")

            too_big = simulated_job("huge", tasks=5, cpu=1000)
            with pytest.raises(grpc.aio.AioRpcError) as quota:
                await client.SubmitJob(borgmaster_pb2.SubmitJobRequest(request_id="r1", spec=too_big))
            assert quota.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "cpu" in (quota.value.details() or "")

            request = borgmaster_pb2.SubmitJobRequest(request_id="r2", spec=simulated_job("web", tasks=2))
            first = await client.SubmitJob(request)
            again = await client.SubmitJob(request)
            assert first.job_id == again.job_id == "alice/web"
            assert first.log_sequence == again.log_sequence > 0
            assert first.state == state_pb2.JOB_STATE_PENDING
            jobs = await client.ListJobs(borgmaster_pb2.ListJobsRequest())
            assert [j.job_id for j in jobs.jobs] == ["alice/web"], "a retried submit creates one job"
            job = (
                await client.GetJob(borgmaster_pb2.GetJobRequest(job_id="alice/web", include_tasks=True))
            ).job
            assert job.task_counts.pending == 2
            assert [t.state for t in job.tasks] == [state_pb2.TASK_STATE_PENDING] * 2
            with pytest.raises(grpc.aio.AioRpcError) as missing:
                await client.GetJob(borgmaster_pb2.GetJobRequest(job_id="alice/none"))
            assert missing.value.code() == grpc.StatusCode.NOT_FOUND

            why = await client.WhyPending(borgmaster_pb2.WhyPendingRequest(job_id="alice/web"))
            assert why.machines_total == 0
            await client.RegisterMachine(
                borgmaster_pb2.RegisterMachineRequest(request_id="m", spec=machine("m0"))
            )
            await client.UpdateJob(
                borgmaster_pb2.UpdateJobRequest(
                    request_id="u1",
                    job_id="alice/web",
                    spec=simulated_job("web", memory=20 << 30),
                    update_mask=FieldMask(paths=["task.limits.memory_bytes"]),
                )
            )
            why = await client.WhyPending(borgmaster_pb2.WhyPendingRequest(job_id="alice/web", task_index=1))
            assert why.machines_total == 1
            assert why.machines_feasible == 0
            memory = [e for e in why.resource_exclusions if e.resource == resources_pb2.RESOURCE_MEMORY]
            assert memory[0].machines_excluded == 1
            assert why.fitting_limits.memory_bytes <= 16 << 30
            quotas = await client.GetQuota(borgmaster_pb2.GetQuotaRequest(user="alice"))
            prod = next(q for q in quotas.quotas if q.band == job_pb2.PRIORITY_BAND_PRODUCTION)
            assert prod.used.memory_bytes == 2 * (20 << 30)


async def test_followers_answer_reads_and_redirect_writes_to_the_master(
    fresh_database_url: str, endpoints: StackEndpoints
) -> None:
    async with replicas(fresh_database_url, endpoints, 2) as masters:
        leader = await leader_of(masters)
        follower = next(m for m in masters if m is not leader)
        lead_channel, lead = stub(leader.address)
        follow_channel, follow = stub(follower.address)
        async with lead_channel, follow_channel:
            await grant(lead, "alice")
            done = await lead.SubmitJob(
                borgmaster_pb2.SubmitJobRequest(request_id="s", spec=simulated_job("web"))
            )

            async def follower_has_it() -> bool:
                return follower.replica.state.last_sequence >= done.log_sequence

            await eventually(follower_has_it, 5, "the follower tails the log")
            read = await follow.GetJob(borgmaster_pb2.GetJobRequest(job_id="alice/web"))
            assert read.job.spec.name == "web"
            # Reads that show soft state (tasks' usage and reservations, machines' usage) go to
            # the master, the only replica that polls the Borglets: a follower redirects them.
            soft_reads = (
                follow.GetJob(borgmaster_pb2.GetJobRequest(job_id="alice/web", include_tasks=True)),
                follow.GetTask(borgmaster_pb2.GetTaskRequest(job_id="alice/web", task_index=0)),
                follow.ListMachines(borgmaster_pb2.ListMachinesRequest()),
            )
            for soft_read in soft_reads:
                with pytest.raises(grpc.aio.AioRpcError) as redirected:
                    await soft_read
                assert redirected.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert (
                    dict(redirected.value.trailing_metadata() or ()).get("cellpilot-leader") == leader.address
                )
            with_tasks = await lead.GetJob(
                borgmaster_pb2.GetJobRequest(job_id="alice/web", include_tasks=True)
            )
            assert len(with_tasks.job.tasks) == 1
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await follow.SubmitJob(
                    borgmaster_pb2.SubmitJobRequest(request_id="s2", spec=simulated_job("other"))
                )
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            trailing = dict(refused.value.trailing_metadata() or ())
            assert trailing.get("cellpilot-leader") == leader.address
            who = await follow.GetLeader(borgmaster_pb2.GetLeaderRequest())
            assert not who.is_leader
            assert who.leader.address == leader.address
            assert who.leader.epoch == leader.replica.epoch
