"""PostgreSQL down under a running Borgmaster (Borg §3.1: no checkpoint, no acknowledged write):
a write is refused with UNAVAILABLE naming the store — not "not the elected master" — and a
client whose deadline outlasts the outage gets its write applied, exactly once, when the
database is back."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from borgmaster_harness import grant, leader_of, replicas, simulated_job, stub
from stack_security import client_options
from store_outages import fresh_database, start_stores, stop_store, use_stack_certificates

from cellpilot.api.v1 import borgmaster_pb2
from cellpilot.borg.mutations import JobSubmitted
from cellpilot.checkpoint_store import PostgresCheckpointStore
from cellpilot.client import CellpilotClient, RetryPolicy
from cellpilot.platform.error_reasons import STORE_UNAVAILABLE, reason_of
from cellpilot.platform.postgres import create_engine
from cellpilot.platform.store_accounts import service_postgres_url
from cellpilot.security.store_secrets import FAUXMASTER_ACCOUNT
from cellpilot.stack import Stack

OUTAGE_S = 4.0


async def _read_log(database_url: str, stack: Stack) -> list:  # type: ignore[type-arg]
    """The checkpoint log, read as `cellpilot borgmaster replay` reads it (the read-only role)."""
    engine = create_engine(service_postgres_url(database_url, FAUXMASTER_ACCOUNT, stack.config.certs_dir))
    try:
        return await PostgresCheckpointStore(engine).read(0, limit=1_000_000)
    finally:
        await engine.dispose()


@pytest.mark.slow
async def test_a_write_during_a_postgres_outage_is_unavailable_and_a_patient_client_applies_it_once(
    outage_stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_stack_certificates(monkeypatch, outage_stack)
    database_url = await fresh_database(outage_stack)
    async with replicas(database_url, outage_stack.admin_endpoints, 1) as masters:
        master = await leader_of(masters)
        channel, raw = stub(master.address)
        policy = RetryPolicy(budget_s=60.0, initial_backoff_s=0.1, max_backoff_s=0.5, call_timeout_s=5.0)
        client = CellpilotClient([master.address], policy=policy, **client_options())
        try:
            await grant(raw, "alice")
            stop_store(outage_stack, "postgres")
            try:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await raw.SubmitJob(
                        borgmaster_pb2.SubmitJobRequest(request_id="no-retry", spec=simulated_job("refused")),
                        timeout=10,
                    )
                assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
                assert "PostgreSQL" in (refused.value.details() or "")
                assert "not the elected master" not in (refused.value.details() or "")
                assert reason_of(refused.value.trailing_metadata()) == STORE_UNAVAILABLE

                # A client with a deadline longer than the outage retries, with the same request id.
                submit = asyncio.create_task(
                    client.borgmaster.submit_job(simulated_job("patient"), request_id="patient-1")
                )
                await asyncio.sleep(OUTAGE_S)
                assert not submit.done(), "the client is still retrying while PostgreSQL is down"
            finally:
                back_at = time.monotonic()
                await start_stores(outage_stack)
            reply = await asyncio.wait_for(submit, timeout=60)
            assert time.monotonic() >= back_at
            assert reply.job_id == "alice/patient"
            assert reply.spec_version == 1
            # The same request again (the retry a client makes after a lost reply) is the first answer.
            again = await client.borgmaster.submit_job(simulated_job("patient"), request_id="patient-1")
            assert (again.job_id, again.log_sequence) == (reply.job_id, reply.log_sequence)
        finally:
            await client.close()
            await channel.close()

    records = await _read_log(database_url, outage_stack)
    submitted = [r for r in records if isinstance(r.mutation, JobSubmitted)]
    assert [r.mutation.job_id for r in submitted] == ["alice/patient"], "applied exactly once"
    assert [r.request_id for r in records if r.request_id == "patient-1"] == ["patient-1"]
    assert all(r.request_id != "no-retry" for r in records), "the refused write was not applied"
