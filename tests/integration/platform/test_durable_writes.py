"""What a write asks of the embedded broker (Tansu 0.6), and what it answers.

The embedded stack's services write with the options chosen for it (``WriteDurability``: acks
all, no idempotence, one replica): each writer of a stream whose records must not be lost
(actuations, Borg events, recommendations) writes a copy of it through the broker, and every
record is there once, in order. An idempotent producer is refused by this broker: aiokafka asks
for a producer id with InitProducerId version 0, which has no producer id and epoch fields, and
Tansu's in-memory engine answers UNKNOWN_SERVER_ERROR — which is why idempotence is a setting,
off here and on with compose's Kafka. Should a Tansu accept it one day, the last test fails
and says to turn the setting on for it.
"""

from __future__ import annotations

import dataclasses
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import UnknownError
from google.protobuf.wrappers_pb2 import StringValue
from stream_writers import as_service, writer_identity

from cellpilot.platform.kafka import MessageProducer, ensure_topics
from cellpilot.platform.settings import PlatformSettings
from cellpilot.platform.stream_access import WriteDurability, producer_options
from cellpilot.platform.topics import Topic, stream_of
from cellpilot.stack import Stack

MUST_NOT_LOSE = ("actuations", "borg.events", "recommendations")
RECORDS = 20


async def _read(bootstrap: str, topic: str, count: int) -> list[bytes]:
    """The first ``count`` values of partition 0, from offset 0 (fails after 30 s)."""
    reader = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await reader.start()
    try:
        tp = TopicPartition(topic, 0)
        reader.assign([tp])
        reader.seek(tp, 0)
        got: list[bytes] = []
        while len(got) < count:
            batch = await reader.getmany(tp, timeout_ms=30_000)
            assert batch, f"{len(got)} of {count} records of {topic} after 30 s"
            got += [r.value for r in batch[tp] if r.value is not None]
        return got
    finally:
        await reader.stop()


def test_the_embedded_stack_s_services_write_with_acks_all_and_without_idempotence(
    embedded_stack: Stack,
) -> None:
    written = PlatformSettings.load(embedded_stack.config.env_path)
    assert written.write_durability() == WriteDurability(idempotence=False, replication_factor=1)


@pytest.mark.parametrize("stream", MUST_NOT_LOSE)
async def test_each_writer_of_a_stream_that_must_not_be_lost_delivers_every_record_once(
    stream: str, embedded_stack: Stack
) -> None:
    bootstrap = embedded_stack.endpoints.kafka_bootstrap
    durability = PlatformSettings.load(embedded_stack.config.env_path).write_durability()
    topic = f"{stream}.{uuid.uuid4().hex[:8]}"  # a copy of the stream: same writers, one partition
    declared = stream_of(topic)
    assert declared is not None
    assert await ensure_topics(bootstrap, [Topic(topic, 1, declared.key, "test")]) == [topic]
    access = dataclasses.replace(as_service(bootstrap, writer_identity(topic)), durability=durability)
    producer = MessageProducer(access, client_id=f"test-{stream}")
    assert producer.options["acks"] == "all"
    assert producer.options["enable_idempotence"] is False
    values = [StringValue(value=f"{stream} {i}") for i in range(RECORDS)]
    await producer.start()
    try:
        offsets = [await producer.send(topic, "job-1", value) for value in values]
    finally:
        await producer.stop()
    assert offsets == list(range(RECORDS)), "each write acknowledged at the next offset"
    assert await _read(bootstrap, topic, RECORDS) == [v.SerializeToString() for v in values]


async def test_tansu_refuses_an_idempotent_producer(embedded_stack: Stack) -> None:
    bootstrap = embedded_stack.endpoints.kafka_bootstrap
    topic = f"test.idempotent.{uuid.uuid4().hex[:8]}"
    await ensure_topics(bootstrap, [Topic(topic, 1, "key", "test")])
    access = dataclasses.replace(as_service(bootstrap), durability=WriteDurability(idempotence=True))
    producer = AIOKafkaProducer(**producer_options(access), request_timeout_ms=10_000)
    try:
        with pytest.raises(UnknownError):  # InitProducerId: UNKNOWN_SERVER_ERROR
            await _start_and_write(producer, topic)
    finally:
        await producer.stop()


async def _start_and_write(producer: AIOKafkaProducer, topic: str) -> None:
    await producer.start()
    await producer.send_and_wait(topic, b"written")
    pytest.fail(
        "Tansu granted a producer id: turn CELLPILOT_KAFKA_IDEMPOTENCE on for it "
        "(docker-compose.yml's offline path, the embedded stack)"
    )
