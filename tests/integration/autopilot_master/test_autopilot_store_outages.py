"""Autopilot's Redis and the Monitoring API's PostgreSQL down under running services: calls fail
with UNAVAILABLE naming the store (retryable) — not UNKNOWN with a driver traceback, nor "not the
elected master" — and a client whose deadline outlasts the outage gets its answer when the
store is back. The actuator goes on applying actuations once its Redis is back (the chaos run
found it consuming nothing ever again after a Redis restart: its loop had ended on the error
while the process, still serving health, looked fine to its supervisor)."""

from __future__ import annotations

import asyncio
import uuid

import grpc
import pytest
from autopilot_master_harness import (
    Publisher,
    Scenario,
    actuator,
    api_client,
    autopilot,
    borgmaster,
    eventually,
    grant,
    job_spec,
    job_status,
)
from stack_security import client_options, user_channel
from store_outages import fresh_database, start_stores, stop_store, use_stack_certificates

from cellpilot.api.v1 import (
    actuation_pb2,
    autopilot_pb2,
    autopilot_pb2_grpc,
    job_pb2,
    monitoring_pb2,
    monitoring_pb2_grpc,
    resources_pb2,
)
from cellpilot.client import CellpilotClient, RetryPolicy
from cellpilot.platform.error_reasons import STORE_UNAVAILABLE, reason_of
from cellpilot.platform.settings import PlatformSettings
from cellpilot.stack import Stack
from cellpilot_services.aggregator.aggregator_service import Aggregator
from cellpilot_services.aggregator.settings import AggregatorSettings

PATIENT = RetryPolicy(budget_s=60.0, initial_backoff_s=0.1, max_backoff_s=0.5, call_timeout_s=5.0)
OUTAGE_S = 2.0


def _refused_for(error: grpc.aio.AioRpcError, store: str) -> None:
    assert error.code() == grpc.StatusCode.UNAVAILABLE, error
    assert f"{store} is unreachable" in (error.details() or "")
    assert reason_of(error.trailing_metadata()) == STORE_UNAVAILABLE


async def _leading(master: object) -> bool:
    return bool(master.is_leader)  # type: ignore[attr-defined]


@pytest.mark.slow
async def test_autopilot_is_unavailable_naming_redis_while_redis_is_down(
    outage_stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_stack_certificates(monkeypatch, outage_stack)
    scenario = Scenario(outage_stack.admin_endpoints)
    await scenario.create_topics()
    async with autopilot(scenario.autopilot_settings(["127.0.0.1:1"])) as master:
        await eventually(lambda: _leading(master), 15, "an elected Autopilot master")
        register = autopilot_pb2.RegisterRecommenderRequest(
            request_id="reg-1", name="mine", resources=[resources_pb2.RESOURCE_CPU]
        )
        async with (
            user_channel(master.address) as channel,
            CellpilotClient(autopilot=[master.address], policy=PATIENT, **client_options()) as client,
        ):
            stub = autopilot_pb2_grpc.AutopilotStub(channel)
            stop_store(outage_stack, "redis")
            try:
                with pytest.raises(grpc.aio.AioRpcError) as read:
                    await stub.GetRecommendation(autopilot_pb2.GetRecommendationRequest(job_id="alice/web"))
                _refused_for(read.value, "Redis")
                with pytest.raises(grpc.aio.AioRpcError) as write:
                    await stub.RegisterRecommender(register)
                assert write.value.code() == grpc.StatusCode.UNAVAILABLE, "never 'not the elected master'"
                patient = asyncio.create_task(client.autopilot.register_recommender(register))
                await asyncio.sleep(OUTAGE_S)
                assert not patient.done(), "the client is still retrying while Redis is down"
            finally:
                await start_stores(outage_stack)
            registered = await asyncio.wait_for(patient, timeout=60)
            assert registered.recommender.ref.custom_name == "mine"
            listed = await client.autopilot.list_recommenders()
            assert "mine" in {r.ref.custom_name for r in listed.recommenders}


@pytest.mark.slow
async def test_monitoring_is_unavailable_naming_postgresql_while_it_is_down(
    outage_stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_stack_certificates(monkeypatch, outage_stack)
    database_url = await fresh_database(outage_stack)
    endpoints = outage_stack.admin_endpoints
    aggregator = Aggregator(
        AggregatorSettings(
            platform=PlatformSettings(
                postgres_url=database_url, kafka_bootstrap=endpoints.kafka_bootstrap, log_json=False
            ),
            port=0,
            metrics_port=0,
            apply_migrations=False,
            consumer_group=f"outage-{uuid.uuid4().hex[:8]}",
        )
    )
    port = await aggregator.start()
    address = f"127.0.0.1:{port}"
    query = monitoring_pb2.GetHistogramHistoryRequest(job_id="alice/web", resource=resources_pb2.RESOURCE_CPU)
    try:
        async with (
            user_channel(address) as channel,
            CellpilotClient(monitoring=[address], policy=PATIENT, **client_options()) as client,
        ):
            stub = monitoring_pb2_grpc.MonitoringStub(channel)
            assert list((await stub.GetHistogramHistory(query)).histograms) == []
            stop_store(outage_stack, "postgres")
            try:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.GetHistogramHistory(query)
                _refused_for(refused.value, "PostgreSQL")
                patient = asyncio.create_task(client.monitoring.histogram_history(query))
                await asyncio.sleep(OUTAGE_S)
                assert not patient.done(), "the client is still retrying while PostgreSQL is down"
            finally:
                await start_stores(outage_stack)
            assert await asyncio.wait_for(patient, timeout=60) == []
    finally:
        await aggregator.stop()


@pytest.mark.slow
async def test_the_actuator_applies_actuations_again_once_its_redis_is_back(
    outage_stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_stack_certificates(monkeypatch, outage_stack)
    scenario = Scenario(outage_stack.admin_endpoints)
    await scenario.create_topics()
    database_url = await fresh_database(outage_stack)

    def actuation(job_id: str, key: str, cpu: int) -> actuation_pb2.Actuation:
        return actuation_pb2.Actuation(
            idempotency_key=key, job_id=job_id, cpu_limit_millicores=cpu, fencing_token=1, leader_id="test"
        )

    async with borgmaster(database_url, scenario) as bm, Publisher(scenario) as publish:
        client = api_client([bm.address])
        await grant(client, scenario.user)
        job = (
            await client.borgmaster.submit_job(
                job_spec("web", scenario.user, cpu_mode=job_pb2.SCALING_MODE_ON)
            )
        ).job_id
        settings = scenario.actuator_settings([bm.address], max_backoff_s=0.5)
        async with actuator(settings) as act:
            await publish.actuation(actuation(job, "before", 700))
            await eventually(lambda: act.results.result("before"), 15, "the first actuation applied")
            stop_store(outage_stack, "redis")
            try:
                await publish.actuation(actuation(job, "during", 800))  # its outcome cannot be saved
                await asyncio.sleep(OUTAGE_S)
            finally:
                await start_stores(outage_stack)
            during = await eventually(
                lambda: act.results.result("during"), 30, "the actuation applied after the outage"
            )
            assert during.outcome == actuation_pb2.ACTUATION_OUTCOME_APPLIED
            await publish.actuation(actuation(job, "after", 900))
            after = await eventually(lambda: act.results.result("after"), 15, "a new actuation applied")
            assert after.outcome == actuation_pb2.ACTUATION_OUTCOME_APPLIED
            status = await job_status(client, job)
            assert status.spec.task.limits.cpu_millicores == 900
            assert status.spec_version == 4, "submitted, then three updates: none applied twice"
        await client.close()
