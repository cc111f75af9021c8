"""Rotating a topic, what `cellpilot run` does to bound the embedded broker's memory.

Tansu 0.6 stores a topic's ``retention.ms`` but never deletes a record by it (and has no
DeleteRecords): deleting the topic is what frees its memory. A rotated topic is empty, keeps
its partitions and its configs, and the broker goes on taking records on it.
"""

from __future__ import annotations

import uuid

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from google.protobuf.wrappers_pb2 import StringValue
from stream_writers import as_service

from cellpilot.platform.kafka import MessageProducer, ensure_topics
from cellpilot.platform.topics import Topic
from cellpilot.stack import StackEndpoints
from cellpilot.stack.broker_retention import drained, log_end_of, rotate_topic


async def _ends(bootstrap: str, topic: Topic) -> dict[int, int]:
    """Each partition's log end, from a fetch reply (the broker's ListOffsets answer lags)."""
    reader = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await reader.start()
    try:
        partitions = [TopicPartition(topic.name, p) for p in range(topic.partitions)]
        reader.assign(partitions)
        for tp in partitions:
            reader.seek(tp, 0)
        while any(reader.highwater(tp) is None for tp in partitions):
            await reader.getmany(timeout_ms=200)
        return {tp.partition: int(reader.highwater(tp) or 0) for tp in partitions}
    finally:
        await reader.stop()


async def test_a_rotated_topic_is_empty_keeps_its_configs_and_takes_records(
    endpoints: StackEndpoints,
) -> None:
    bootstrap = endpoints.kafka_bootstrap
    topic = Topic(f"test.rotated.{uuid.uuid4().hex[:8]}", 2, "key", "test", retention_ms=600_000)
    await ensure_topics(bootstrap, [topic])
    producer = MessageProducer(as_service(bootstrap))
    await producer.start()
    try:
        for i in range(6):
            await producer.send(topic.name, f"k{i}", StringValue(value=f"v{i}"))
        assert sum((await _ends(bootstrap, topic)).values()) == 6
        assert (await rotate_topic(bootstrap, topic)).held == 6
        assert await _ends(bootstrap, topic) == {0: 0, 1: 0}
        await producer.send(topic.name, "k", StringValue(value="after"))
        assert sum((await _ends(bootstrap, topic)).values()) == 1
    finally:
        await producer.stop()
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        (described,) = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic.name)])
    finally:
        await admin.close()
    entries = {entry[0]: entry[1] for resource in described.resources for entry in resource[4]}
    assert entries.get("retention.ms") == "600000", "stored (and enforced by a real Kafka broker)"


async def _group_member(bootstrap: str, topic: Topic, group: str) -> AIOKafkaConsumer:
    """A member of ``group`` with the topic's partitions assigned (so it may commit on them)."""
    consumer = AIOKafkaConsumer(
        topic.name, bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    while not consumer.assignment():
        await consumer.getmany(timeout_ms=200)
    return consumer


async def test_a_rotation_waits_for_a_group_and_counts_what_it_had_not_applied(
    endpoints: StackEndpoints,
) -> None:
    bootstrap = endpoints.kafka_bootstrap
    group = f"test-group-{uuid.uuid4().hex[:8]}"
    topic = Topic(f"test.drained.{uuid.uuid4().hex[:8]}", 1, "key", "test", 600_000, (group,))
    await ensure_topics(bootstrap, [topic])
    producer = MessageProducer(as_service(bootstrap))
    await producer.start()
    consumer = await _group_member(bootstrap, topic, group)
    try:
        for i in range(5):
            await producer.send(topic.name, f"k{i}", StringValue(value=f"v{i}"))
        ends = await log_end_of(bootstrap, topic)
        partition = TopicPartition(topic.name, 0)
        assert ends == {partition: 5}
        await consumer.commit({partition: 3})  # the group applied 3 of the 5
        assert not await drained(bootstrap, topic, ends), "two records are not applied yet"
        rotation = await rotate_topic(bootstrap, topic)
        assert rotation.held == 5
        assert rotation.unapplied_by_group == {group: 2}, "what the group loses is counted"
        assert f"{group} 2" in rotation.describe()
    finally:
        await consumer.stop()
        await producer.stop()


async def test_a_group_that_applied_the_whole_log_lets_the_rotation_go(endpoints: StackEndpoints) -> None:
    bootstrap = endpoints.kafka_bootstrap
    group = f"test-group-{uuid.uuid4().hex[:8]}"
    topic = Topic(f"test.caught.{uuid.uuid4().hex[:8]}", 1, "key", "test", 600_000, (group,))
    await ensure_topics(bootstrap, [topic])
    producer = MessageProducer(as_service(bootstrap))
    await producer.start()
    consumer = await _group_member(bootstrap, topic, group)
    try:
        for i in range(3):
            await producer.send(topic.name, f"k{i}", StringValue(value=f"v{i}"))
        ends = await log_end_of(bootstrap, topic)
        await consumer.commit({TopicPartition(topic.name, 0): 3})
        assert await drained(bootstrap, topic, ends)
        assert (await rotate_topic(bootstrap, topic)).unapplied_by_group.get(group) == 0
    finally:
        await consumer.stop()
        await producer.stop()
