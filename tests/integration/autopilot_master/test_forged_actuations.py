"""Nobody can forge the actuations stream: the actuator applies only what the Autopilot master signed.

Anyone who reaches the broker's port can write any topic with a plain Kafka client. A forged
actuation with a huge fencing token, applied, would set the job's limits and fence out the real
Autopilot master (the actuator and the Borgmaster keep the highest token they have seen). Here
it is refused, filed on ``deadletter`` with the reason and the producer it claims to be, and
logged at WARNING; the master's next actuation is applied. A copy of a genuine actuation (a
replay) is refused too, before the actuator sees it.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from autopilot_master_harness import (
    Publisher,
    Scenario,
    actuator,
    api_client,
    borgmaster,
    eventually,
    grant,
    job_spec,
    job_status,
)
from stream_writers import observer

from cellpilot.api.v1 import actuation_pb2, job_pb2
from cellpilot.platform.kafka import DEADLETTER_TOPIC, Record
from cellpilot.platform.kafka_consumers import MessageConsumer
from cellpilot.security.record_signing import HEADER_PRODUCER, SIGNING_HEADERS
from cellpilot.stack import StackEndpoints

APPLIED = actuation_pb2.ACTUATION_OUTCOME_APPLIED
ON = job_pb2.SCALING_MODE_ON
FORGED_TOKEN = 10**12


def _actuation(job_id: str, key: str, token: int, cpu: int) -> actuation_pb2.Actuation:
    return actuation_pb2.Actuation(
        idempotency_key=key, job_id=job_id, cpu_limit_millicores=cpu, fencing_token=token, leader_id="test"
    )


async def _write_plainly(
    bootstrap: str, topic: str, key: str, value: bytes, headers: list[tuple[str, bytes]]
) -> None:
    """What any local process can do: a plain Kafka client, no key of the stack's."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(topic, value, key=key.encode(), headers=headers)
    finally:
        await producer.stop()


async def _raw_records(bootstrap: str, topic: str, partitions: int = 3) -> list[tuple[bytes, bytes, list]]:
    """Every record of ``topic`` as stored (key, value, headers), read with a plain client."""
    reader = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await reader.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        reader.assign(tps)
        for tp in tps:
            reader.seek(tp, 0)
        out: list[tuple[bytes, bytes, list]] = []
        while fetched := await reader.getmany(timeout_ms=1000):
            for messages in fetched.values():
                out += [(m.key or b"", m.value or b"", list(m.headers or ())) for m in messages]
        return out
    finally:
        await reader.stop()


async def _letters_for(bootstrap: str, topic: str, want: int) -> list[Record]:
    """The dead letters filed for records of ``topic`` (at least ``want`` of them)."""
    consumer = MessageConsumer(observer(bootstrap), [DEADLETTER_TOPIC], group_id=f"dl-{uuid.uuid4().hex[:8]}")
    await consumer.start()
    found: list[Record] = []

    async def read() -> None:
        async for batch in consumer.batches(timeout_ms=200):
            found.extend(r for r in batch if dict(r.headers).get("source-topic") == topic.encode())
            if len(found) >= want:
                return

    try:
        await asyncio.wait_for(read(), 30)
    finally:
        await consumer.stop()
    return found


async def test_a_forged_actuation_is_not_applied_and_does_not_fence_out_the_master(
    fresh_database_url: str, endpoints: StackEndpoints, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="cellpilot.platform.signed_streams")
    scenario = Scenario(endpoints)
    await scenario.create_topics()
    bootstrap = endpoints.kafka_bootstrap
    async with borgmaster(fresh_database_url, scenario) as bm, Publisher(scenario) as publish:
        client = api_client([bm.address])
        await grant(client, scenario.user)
        job = await client.borgmaster.submit_job(job_spec("web", scenario.user, cpu_mode=ON))
        async with actuator(scenario.actuator_settings([bm.address])) as act:
            # The master's first decision: applied (and a signed record to borrow headers from).
            await publish.actuation(_actuation(job.job_id, "real-1", 5, 700))
            assert (
                await eventually(lambda: act.results.result("real-1"), 15, "real-1 settled")
            ).outcome == APPLIED

            forged = _actuation(job.job_id, "forged-1", FORGED_TOKEN, 7777).SerializeToString()
            await _write_plainly(
                bootstrap, scenario.actuations, job.job_id, forged, [(HEADER_PRODUCER, b"autopilot")]
            )
            # The genuine record's signature headers on another value.
            (genuine,) = [r for r in await _raw_records(bootstrap, scenario.actuations) if len(r[2]) > 1]
            borrowed = [(n, v) for n, v in genuine[2] if n in SIGNING_HEADERS]
            forged_again = _actuation(job.job_id, "forged-2", FORGED_TOKEN, 7777).SerializeToString()
            await _write_plainly(bootstrap, scenario.actuations, job.job_id, forged_again, borrowed)

            # The master's next decision, under its own (much lower) token: applied, not fenced.
            await publish.actuation(_actuation(job.job_id, "real-2", 6, 600))
            result = await eventually(lambda: act.results.result("real-2"), 15, "real-2 settled")
            assert result.outcome == APPLIED, result.detail
            assert await act.results.result("forged-1") is None
            assert await act.results.result("forged-2") is None
            assert act.guard.highest_token == 6
            status = await job_status(client, job.job_id)
            assert status.spec.task.limits.cpu_millicores == 600
            assert status.fencing_token == 6

        letters = await _letters_for(bootstrap, scenario.actuations, 2)
        refusals = {dict(r.headers)["refusal"]: r for r in letters}
        assert set(refusals) == {b"malformed", b"bad-signature"}
        assert refusals[b"malformed"].value == forged
        assert refusals[b"bad-signature"].value == forged_again
        assert all(dict(r.headers)["claimed-producer"] == b"autopilot" for r in letters)
        assert dict(letters[0].headers)["cp-producer"] == b"actuator", "filed by the reader that refused it"
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any(
            f"refused a record of {scenario.actuations} from autopilot: bad-signature" in w for w in warnings
        )
        await client.close()


async def test_a_replayed_genuine_actuation_is_refused(
    fresh_database_url: str, endpoints: StackEndpoints
) -> None:
    scenario = Scenario(endpoints)
    await scenario.create_topics()
    bootstrap = endpoints.kafka_bootstrap
    async with borgmaster(fresh_database_url, scenario) as bm, Publisher(scenario) as publish:
        client = api_client([bm.address])
        await grant(client, scenario.user)
        job = await client.borgmaster.submit_job(job_spec("web", scenario.user, cpu_mode=ON))
        async with actuator(scenario.actuator_settings([bm.address])) as act:
            await publish.actuation(_actuation(job.job_id, "k1", 5, 700))
            assert (await eventually(lambda: act.results.result("k1"), 15, "k1 settled")).outcome == APPLIED
            (original,) = await _raw_records(bootstrap, scenario.actuations)
            await _write_plainly(
                bootstrap, scenario.actuations, original[0].decode(), original[1], original[2]
            )
            (letter,) = await _letters_for(bootstrap, scenario.actuations, 1)
            assert dict(letter.headers)["refusal"] == b"replayed"
            assert letter.value == original[1]
            await asyncio.sleep(0.5)
            # Never handed to the actuator: not even seen as a duplicate of k1.
            assert act.outcomes["duplicate"] == 0
            assert await act.results.replays("k1") == 0
        await client.close()
