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

from cellpilot.platform.kafka import MessageProducer, ensure_topics
from cellpilot.platform.topics import Topic
from cellpilot.stack import StackEndpoints
from cellpilot.stack.broker_retention import rotate_topic


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
    producer = MessageProducer(bootstrap)
    await producer.start()
    try:
        for i in range(6):
            await producer.send(topic.name, f"k{i}", StringValue(value=f"v{i}"))
        assert sum((await _ends(bootstrap, topic)).values()) == 6
        assert await rotate_topic(bootstrap, topic) > 0
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
