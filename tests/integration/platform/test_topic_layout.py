"""A restarted broker gets every topic back with its declared partition count.

A broker that lost its log knows no topic; the first client that names one (a producer's
record, a consumer's metadata request) makes the embedded broker create it with its default
count. The chaos run found the restarted broker's ``recommendations`` with 4 partitions instead
of 6: the Autopilot master still held positions for partitions 4 and 5, and every check of its
positions against the broker's logs then waited its full timeout, so it acted once per 5 s.
``ensure_topics`` leaves such a topic as it is; ``ensure_topic_layout`` (what the supervisor
runs after restarting the broker, and a rotation after deleting a topic) creates it again.
"""

from __future__ import annotations

import uuid

from google.protobuf.wrappers_pb2 import StringValue
from stream_writers import as_service

from cellpilot.platform.kafka import MessageProducer, ensure_topic_layout, ensure_topics, partition_counts
from cellpilot.platform.topics import Topic
from cellpilot.stack import StackEndpoints


async def test_a_topic_the_broker_created_with_its_default_count_is_created_again_with_the_declared_one(
    endpoints: StackEndpoints,
) -> None:
    bootstrap = endpoints.kafka_bootstrap
    early = Topic(f"test.layout.early.{uuid.uuid4().hex[:8]}", 2, "key", "test")
    declared = Topic(f"test.layout.kept.{uuid.uuid4().hex[:8]}", 3, "key", "test")
    await ensure_topics(bootstrap, [declared])
    producer = MessageProducer(as_service(bootstrap))
    await producer.start()
    try:
        await producer.send(declared.name, "k", StringValue(value="kept"))
        # As a client that lets the broker create a topic it names would leave it (Cellpilot's own
        # never do): the broker's default partition count, not the declared one.
        await ensure_topics(bootstrap, [Topic(early.name, 4, "key", "test")])
        await producer.send(early.name, "k", StringValue(value="before the topic was declared"))
        default = (await partition_counts(bootstrap, [early.name]))[early.name]
        assert default != early.partitions, "the topic has another count than declared"
        assert await ensure_topics(bootstrap, [early, declared]) == [], "ensure_topics sees it exists"

        assert await ensure_topic_layout(bootstrap, [early, declared]) == [early.name]
        assert await partition_counts(bootstrap, [early.name, declared.name]) == {
            early.name: 2,
            declared.name: 3,
        }
        assert await ensure_topic_layout(bootstrap, [early, declared]) == [], "a right layout is left alone"
        offset = await producer.send(declared.name, "k", StringValue(value="after"))
        assert offset == 1, "the topic with its declared count kept its records"
        await producer.send(early.name, "k", StringValue(value="the producer follows the new topic"))
    finally:
        await producer.stop()
