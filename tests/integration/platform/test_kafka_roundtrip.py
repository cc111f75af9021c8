"""Round trips through the real broker with the platform's Kafka helpers.

Delivery is at-least-once; processing is made exactly-once by the AppliedOffsets fence
(see cellpilot.platform.kafka), which these tests exercise across a consumer restart.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

from google.protobuf.wrappers_pb2 import StringValue
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from cellpilot.platform.kafka import AppliedOffsets, MessageConsumer, MessageProducer, Record, ensure_topics
from cellpilot.platform.topics import Topic
from cellpilot.stack import StackEndpoints


async def _new_topic(bootstrap: str, partitions: int) -> str:
    name = f"test.{uuid.uuid4().hex[:12]}"
    assert await ensure_topics(bootstrap, [Topic(name, partitions, "test key", "test")]) == [name]
    return name


async def _publish(bootstrap: str, topic: str, values: list[str]) -> None:
    producer = MessageProducer(bootstrap)
    await producer.start()
    try:
        for value in values:
            await producer.send(topic, key=value, message=StringValue(value=value))
    finally:
        await producer.stop()


async def _collect(consumer: MessageConsumer, want: int, timeout_s: float = 30.0) -> list[Record]:
    got: list[Record] = []

    async def loop() -> None:
        async for batch in consumer.batches(timeout_ms=200):
            got.extend(batch)
            if len(got) >= want:
                return

    await asyncio.wait_for(loop(), timeout_s)
    return got


async def _wait_for_assignment(
    consumers: list[MessageConsumer], partitions: int, timeout_s: float = 30.0
) -> None:
    async def until_assigned() -> None:
        while True:
            # Polling drives the group protocol (join, sync) forward.
            for consumer in consumers:
                async for _ in consumer.batches(timeout_ms=100):
                    break
            assigned = [consumer.assignment() for consumer in consumers]
            if all(assigned) and sum(len(a) for a in assigned) == partitions:
                return

    await asyncio.wait_for(until_assigned(), timeout_s)


async def test_trace_context_travels_in_the_headers(endpoints: StackEndpoints) -> None:
    topic = await _new_topic(endpoints.kafka_bootstrap, 1)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    trace.set_tracer_provider(provider)
    with tracer.start_as_current_span("sample taken") as parent:
        await _publish(endpoints.kafka_bootstrap, topic, ["traced"])
    consumer = MessageConsumer(endpoints.kafka_bootstrap, [topic], group_id=f"g-{uuid.uuid4().hex[:6]}")
    await consumer.start()
    try:
        (record,) = await _collect(consumer, 1)
    finally:
        await consumer.stop()
    assert record.decode(StringValue).value == "traced"
    assert any(key == "traceparent" for key, _ in record.headers)
    with tracer.start_as_current_span("histogram built", context=record.trace_context) as child:
        pass
    assert child.get_span_context().trace_id == parent.get_span_context().trace_id
    publish_spans = [s for s in exporter.get_finished_spans() if s.name == f"{topic} publish"]
    assert publish_spans, "publishing must create a span"
    assert publish_spans[0].kind == trace.SpanKind.PRODUCER


async def test_a_group_of_two_shares_partitions_and_sees_every_message_once(
    endpoints: StackEndpoints,
) -> None:
    partitions = 4
    topic = await _new_topic(endpoints.kafka_bootstrap, partitions)
    group = f"g-{uuid.uuid4().hex[:6]}"
    consumers = [MessageConsumer(endpoints.kafka_bootstrap, [topic], group_id=group) for _ in range(2)]
    for consumer in consumers:
        await consumer.start()
    try:
        await _wait_for_assignment(consumers, partitions)
        sent = [f"m{i}" for i in range(40)]
        await _publish(endpoints.kafka_bootstrap, topic, sent)
        got: list[list[Record]] = [[], []]

        async def drain(i: int) -> None:
            async for batch in consumers[i].batches(timeout_ms=200):
                got[i].extend(batch)
                await consumers[i].commit(batch)
                if sum(len(g) for g in got) >= len(sent):
                    return

        await asyncio.wait_for(asyncio.gather(drain(0), drain(1)), 30)
    finally:
        for consumer in consumers:
            await consumer.stop()
    values = Counter(r.decode(StringValue).value for g in got for r in g)
    assert set(values) == set(sent)
    assert max(values.values()) == 1, "no message may reach the group twice while membership is stable"
    assert all(got), "both members of the group must receive records"
    partitions_seen = [{r.partition for r in g} for g in got]
    assert not (partitions_seen[0] & partitions_seen[1]), "a partition belongs to one member at a time"


async def test_restart_redelivers_uncommitted_records_and_the_fence_applies_each_once(
    endpoints: StackEndpoints,
) -> None:
    topic = await _new_topic(endpoints.kafka_bootstrap, 1)
    group = f"g-{uuid.uuid4().hex[:6]}"
    await _publish(endpoints.kafka_bootstrap, topic, [f"a{i}" for i in range(10)])
    applied: list[str] = []
    fence = AppliedOffsets()

    def apply(records: list[Record]) -> None:
        for record in records:
            if fence.is_new(record):
                applied.append(record.decode(StringValue).value)
                fence.mark(record)

    first = MessageConsumer(endpoints.kafka_bootstrap, [topic], group_id=group)
    await first.start()
    records = await _collect(first, 10)
    apply(records)
    await first.commit(records[:5])  # the process "crashes" before committing the rest
    await first.stop()
    stored_fence = fence.to_mapping()  # what the service stored atomically with its state

    await _publish(endpoints.kafka_bootstrap, topic, [f"b{i}" for i in range(5)])
    fence = AppliedOffsets.from_mapping(stored_fence)
    second = MessageConsumer(endpoints.kafka_bootstrap, [topic], group_id=group)
    await second.start()
    try:
        redelivered = await _collect(second, 10)
        await second.commit(redelivered)
    finally:
        await second.stop()
    assert [r.offset for r in redelivered][:5] == [5, 6, 7, 8, 9], "uncommitted records come again"
    apply(redelivered)
    assert applied == [f"a{i}" for i in range(10)] + [f"b{i}" for i in range(5)]


async def test_a_fence_beyond_the_log_end_is_reset_so_a_lost_log_is_applied_again(
    endpoints: StackEndpoints,
) -> None:
    """A memory-only broker that restarted: offsets begin again at 0, below the stored fence."""
    topic = await _new_topic(endpoints.kafka_bootstrap, 1)
    await _publish(endpoints.kafka_bootstrap, topic, [f"n{i}" for i in range(5)])
    fence = AppliedOffsets({(topic, 0): 50})  # stored before the broker lost its log
    consumer = MessageConsumer(endpoints.kafka_bootstrap, [topic], group_id=f"g-{uuid.uuid4().hex[:6]}")
    await consumer.start()
    try:
        records = await _collect(consumer, 5)
        assert consumer.log_ends(records) == {(topic, 0): 5}
        assert fence.follow_log_resets(consumer.log_ends(records)) == [(topic, 0)]
    finally:
        await consumer.stop()
    applied = [r.offset for r in records if fence.is_new(r)]
    assert applied == [0, 1, 2, 3, 4], "the new log's records are applied, not skipped"
    for record in records:
        fence.mark(record)
    assert fence.follow_log_resets({(topic, 0): 5}) == [], "a fence at the log end stays"
