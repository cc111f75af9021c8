"""A request id names one request (Borg §4: retries are idempotent): reusing a SubmitJob's id for
a KillJob or an UpdateJob is refused naming ``request_id`` and the method it was first used for —
not answered OK with nothing applied — while the same request again gets the first answer. The
ids live in the checkpoint, so a new master (tailing the log, or loading a snapshot) agrees."""

from __future__ import annotations

import grpc
import pytest
from borgmaster_harness import grant, leader_of, replicas, settings, simulated_job, stub
from google.protobuf.field_mask_pb2 import FieldMask

from cellpilot.api.v1 import borgmaster_pb2, borgmaster_pb2_grpc
from cellpilot.platform.error_reasons import REQUEST_ID_REUSED, reason_of
from cellpilot.stack import StackEndpoints
from cellpilot_services.borgmaster.borgmaster_service import Borgmaster

SUBMIT = borgmaster_pb2.SubmitJobRequest(request_id="first-id", spec=simulated_job("web", tasks=2))
REUSES = {
    "KillJob": borgmaster_pb2.KillJobRequest(request_id="first-id", job_id="alice/web"),
    "UpdateJob": borgmaster_pb2.UpdateJobRequest(
        request_id="first-id",
        job_id="alice/web",
        spec=simulated_job("web", tasks=5),
        update_mask=FieldMask(paths=["task_count"]),
    ),
    "SubmitJob": borgmaster_pb2.SubmitJobRequest(request_id="first-id", spec=simulated_job("web", tasks=3)),
}


async def _check(client: borgmaster_pb2_grpc.BorgmasterStub, first: borgmaster_pb2.SubmitJobResponse) -> None:
    """Every reuse refused naming the id and its first use; the job untouched; the retry answered."""
    for method, request in REUSES.items():
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await getattr(client, method)(request)
        details = refused.value.details() or ""
        assert refused.value.code() == grpc.StatusCode.ALREADY_EXISTS, method
        assert details.startswith("request_id: 'first-id' was first used for SubmitJob of job alice/web"), (
            details
        )
        assert reason_of(refused.value.trailing_metadata()) == REQUEST_ID_REUSED
        if method == "SubmitJob":
            assert "different payload" in details
    job = (await client.GetJob(borgmaster_pb2.GetJobRequest(job_id="alice/web"))).job
    assert (job.spec.task_count, job.spec_version) == (2, 1), "no reuse changed the job"
    retried = await client.SubmitJob(SUBMIT)
    assert (retried.job_id, retried.spec_version, retried.log_sequence) == (
        first.job_id,
        first.spec_version,
        first.log_sequence,
    )


@pytest.mark.slow
async def test_a_reused_request_id_is_refused_on_every_master_and_a_retry_still_replays(
    fresh_database_url: str, endpoints: StackEndpoints
) -> None:
    async with replicas(fresh_database_url, endpoints, 2, poll_interval_s=600) as masters:
        old = await leader_of(masters)
        channel, client = stub(old.address)
        async with channel:
            await grant(client, "alice")
            first = await client.SubmitJob(SUBMIT)
            await _check(client, first)
        # Failover: the follower, which tailed the log, takes over.
        new = next(m for m in masters if m is not old)
        await old.stop()
        await leader_of([new], within=10)
        channel, client = stub(new.address)
        async with channel:
            await _check(client, first)
        # Replay from a snapshot: a replica that starts from it knows the ids too.
        await new.replica.write_snapshot()
        await new.stop()
        later = Borgmaster(settings(fresh_database_url, endpoints, 5, poll_interval_s=600))
        await later.start()
        try:
            await leader_of([later], within=10)
            assert later.replica.core.loaded_snapshot_seq > 0
            channel, client = stub(later.address)
            async with channel:
                await _check(client, first)
        finally:
            await later.stop()
