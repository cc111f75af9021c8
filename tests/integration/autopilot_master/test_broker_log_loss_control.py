"""The Autopilot master, the actuator and the Borgmaster's event publisher when the embedded
broker loses its log.

The embedded broker keeps records in memory only: a restart begins every partition again at
offset 0, below the positions stored in Redis (the master's and the actuator's) and in
PostgreSQL (the publisher's). Each runs in-process against a broker of the test's own and must

* notice it without traffic: restarted under a running service that receives nothing, the
  new log is noticed within a few position-check periods (a WARNING with the numbers); the
  event publisher then publishes again the events it still holds, at least once;
* apply the new log from its beginning even when it grew past the stored position before
  the service looked (the service was stopped meanwhile): every record is applied, none
  skipped as "already applied".
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from autopilot_master_harness import (
    BORGMASTER_FAST,
    Publisher,
    Scenario,
    actuator,
    api_client,
    autopilot,
    eventually,
    grant,
    job_spec,
    job_status,
    vertical_set,
    window,
)
from autopilot_processes import read_all
from cell_scheduler import scheduler
from own_broker import OwnBroker
from stream_writers import StreamWriter

from cellpilot.api.v1 import actuation_pb2, job_pb2, state_pb2
from cellpilot.platform.redis_client import connect_redis
from cellpilot.platform.settings import PlatformSettings
from cellpilot.platform.topics import Topic
from cellpilot.stack import StackEndpoints
from cellpilot_services.actuator.actuator_service import Actuator
from cellpilot_services.autopilot.state_store import StateStore
from cellpilot_services.borgmaster.borgmaster_service import Borgmaster
from cellpilot_services.borgmaster.settings import BorgmasterSettings

CHECK_S = 0.5
NOTICED_WITHIN_S = 8 * CHECK_S
ON = job_pb2.SCALING_MODE_ON


def noticed(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    return any(r.levelno == logging.WARNING and text in r.getMessage() for r in caplog.records)


def platform(scenario: Scenario, database_url: str = "") -> PlatformSettings:
    return scenario.platform(database_url).model_copy(update={"log_check_interval_s": CHECK_S})


@asynccontextmanager
async def cell(
    endpoints: StackEndpoints, database_url: str, tmp_path: Path
) -> AsyncIterator[tuple[Scenario, OwnBroker, Borgmaster]]:
    """A broker of the test's own with the scenario's topics, and a Borgmaster."""
    scenario = Scenario(endpoints)
    topics = [Topic(name, 1, "job id", "test") for name in (scenario.recommendations, scenario.actuations)]
    async with OwnBroker(tmp_path / "broker", topics) as broker:
        scenario.endpoints = broker.endpoints(endpoints)
        master = Borgmaster(
            BorgmasterSettings(
                platform=platform(scenario, database_url),
                port=0,
                apply_migrations=False,
                publish_events=False,
                **BORGMASTER_FAST,  # type: ignore[arg-type]
            )
        )
        await master.start()
        try:
            await eventually(lambda: _async(master.replica.is_leader), 15, "the Borgmaster elected")
            async with scheduler([master.address], master.settings):
                yield scenario, broker, master
        finally:
            await master.stop()


async def test_the_autopilot_master_applies_a_lost_log_again_and_notices_one_without_traffic(
    endpoints: StackEndpoints, fresh_database_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="cellpilot.platform.kafka")
    async with cell(endpoints, fresh_database_url, tmp_path) as (scenario, broker, master):
        # The Borgmaster knows none of these jobs: the master stores their recommendations anyway.
        settings = scenario.autopilot_settings([master.address], platform=platform(scenario))
        redis = connect_redis(scenario.endpoints.redis_url)
        store = StateStore(redis, scenario.autopilot_prefix, lock_key="(reads only)")

        async def stored(jobs: list[str]) -> bool:
            return all([await store.has_candidates(job) for job in jobs])

        async def publish(jobs: list[str]) -> None:
            async with Publisher(scenario) as publisher:
                for i, job in enumerate(jobs):
                    await publisher.recommendations(vertical_set(job, window(i), 500, 1 << 30))

        try:
            async with autopilot(settings):
                await publish([f"old/{i}" for i in range(3)])
                await eventually(lambda: stored([f"old/{i}" for i in range(3)]), 30, "the first records")
            assert (await store.offsets()).next_offset[(scenario.recommendations, 0)] == 3

            await broker.restart()  # lost while no master runs; the new log grows past 3
            fresh = [f"new/{i}" for i in range(6)]
            await publish(fresh)
            async with autopilot(settings):
                await eventually(lambda: stored(fresh), 30, "every record of the new log applied")
                assert noticed(caplog, f"the log of {scenario.recommendations}/0")

                caplog.clear()
                await broker.restart()  # under the running master, no traffic
                await eventually(
                    lambda: _async(noticed(caplog, f"the log of {scenario.recommendations}/0")),
                    NOTICED_WITHIN_S + 5,
                    "the WARNING",
                )
                later = [f"later/{i}" for i in range(2)]
                await publish(later)
                await eventually(lambda: stored(later), 30, "records after the restart applied")
                assert (await store.offsets()).next_offset[(scenario.recommendations, 0)] == 2
        finally:
            await redis.aclose()


def _actuation(job_id: str, key: str, cpu: int) -> actuation_pb2.Actuation:
    return actuation_pb2.Actuation(
        idempotency_key=key, job_id=job_id, cpu_limit_millicores=cpu, fencing_token=1, leader_id="test"
    )


async def test_the_actuator_applies_a_lost_log_again_and_notices_one_without_traffic(
    endpoints: StackEndpoints, fresh_database_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="cellpilot.platform.kafka")
    async with cell(endpoints, fresh_database_url, tmp_path) as (scenario, broker, master):
        client = api_client([master.address])
        await grant(client, scenario.user)
        job = (await client.borgmaster.submit_job(job_spec("web", scenario.user, cpu_mode=ON))).job_id
        settings = scenario.actuator_settings([master.address], platform=platform(scenario))

        async def publish(keys: list[str], cpu: int) -> None:
            async with Publisher(scenario) as publisher:
                for i, key in enumerate(keys):
                    await publisher.actuation(_actuation(job, key, cpu + i))

        async def settled(act: Actuator, keys: list[str]) -> bool:
            return all([await act.results.result(key) is not None for key in keys])

        async with actuator(settings) as act:
            await publish(["a0", "a1", "a2"], 600)
            await eventually(lambda: settled(act, ["a0", "a1", "a2"]), 30, "the first actuations applied")

        await broker.restart()  # lost while the actuator is away; the new log grows past 3
        fresh = [f"b{i}" for i in range(6)]
        await publish(fresh, 700)
        async with actuator(settings) as act:
            await eventually(lambda: settled(act, fresh), 30, "every actuation of the new log applied")
            assert act.outcomes["applied"] == 6
            assert (await job_status(client, job)).spec.task.limits.cpu_millicores == 705
            assert noticed(caplog, f"the log of {scenario.actuations}/0")

            caplog.clear()
            await broker.restart()  # under the running actuator, no traffic
            await eventually(
                lambda: _async(noticed(caplog, f"the log of {scenario.actuations}/0")),
                NOTICED_WITHIN_S + 5,
                "the WARNING",
            )
            await publish(["c0"], 800)
            await eventually(lambda: settled(act, ["c0"]), 30, "the actuation after the restart applied")
            assert (await job_status(client, job)).spec.task.limits.cpu_millicores == 800


async def test_the_event_publisher_publishes_again_what_a_lost_log_held(
    endpoints: StackEndpoints, fresh_database_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    scenario = Scenario(endpoints)
    events_topic = f"borg.events.{uuid.uuid4().hex[:8]}"
    broker = OwnBroker(tmp_path / "broker", [Topic(events_topic, 1, "job id", "test")])
    await broker.start()
    scenario.endpoints = broker.endpoints(endpoints)
    settings = BorgmasterSettings(
        platform=platform(scenario, fresh_database_url),
        port=0,
        apply_migrations=False,
        publish_events=True,
        events_topic=events_topic,
        **BORGMASTER_FAST,  # type: ignore[arg-type]
    )

    async def published_sequences() -> set[int]:
        records = await read_all(broker.bootstrap, events_topic, idle_s=1.0, timeout_s=20)
        events = [r.decode(state_pb2.BorgEvent) for r in records]
        return {getattr(e, e.WhichOneof("event")).log_sequence for e in events if e.WhichOneof("event")}

    async def started() -> Borgmaster:
        master = Borgmaster(settings)
        await master.start()
        await eventually(lambda: _async(master.replica.is_leader), 15, "the Borgmaster elected")
        return master

    master = await started()
    try:
        client = api_client([master.address])
        await grant(client, scenario.user)
        await client.borgmaster.submit_job(job_spec("web", scenario.user))
        first = await eventually(published_sequences, 30, "the job's events published")
        await master.stop()

        # Lost while the Borgmaster is away, and another log grew past what it had published.
        await broker.restart()
        producer = StreamWriter(broker.bootstrap)
        await producer.start()
        for i in range(len(first) + 5):  # another cell's events, say
            await producer.send(
                events_topic, "other", state_pb2.BorgEvent(job=state_pb2.JobEvent(job_id=f"x/{i}"))
            )
        await producer.stop()
        master = await started()
        await eventually(lambda: _has(published_sequences, first), 30, "the held events published again")
        assert noticed(caplog, f"{events_topic} lost events published")

        caplog.clear()
        await broker.restart()  # under the running publisher, no Borgmaster activity
        await eventually(
            lambda: _async(noticed(caplog, f"{events_topic} lost events published")),
            NOTICED_WITHIN_S + 5,
            "the publisher's WARNING",
        )
        await eventually(lambda: _has(published_sequences, first), 30, "published again, once more")
    finally:
        await master.stop()
        await broker.stop()


async def _has(read: object, wanted: set[int]) -> bool:
    got: set[int] = await read()  # type: ignore[operator]
    return wanted <= got


async def _async(value: bool) -> bool:
    return value
