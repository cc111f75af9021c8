"""Round trips through the real broker with the platform's Kafka helpers.

Delivery is at-least-once; processing is made exactly-once by the AppliedOffsets fence
(see cellpilot.platform.kafka), which these tests exercise across a consumer restart, and
stored positions are checked against the broker's log, which these tests exercise with a
topic deleted and created again (its log begins anew, as after a memory-only broker's restart).
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

from aiokafka.admin import AIOKafkaAdminClient
from google.protobuf.wrappers_pb2 import StringValue
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from stream_writers import as_service, observer

from cellpilot.platform.kafka import AppliedOffsets, LogPositions, MessageProducer, Record, ensure_topics
from cellpilot.platform.kafka_consumers import AssignedConsumer, MessageConsumer
from cellpilot.platform.topics import Topic
from cellpilot.stack import StackEndpoints


async def _new_topic(bootstrap: str, partitions: int) -> str:
    name = f"test.{uuid.uuid4().hex[:12]}"
    assert await ensure_topics(bootstrap, [Topic(name, partitions, "test key", "test")]) == [name]
    return name


async def _publish(bootstrap: str, topic: str, values: list[str]) -> None:
    producer = MessageProducer(as_service(bootstrap))
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
    consumer = MessageConsumer(
        observer(endpoints.kafka_bootstrap), [topic], group_id=f"g-{uuid.uuid4().hex[:6]}"
    )
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
    consumers = [
        MessageConsumer(observer(endpoints.kafka_bootstrap), [topic], group_id=group) for _ in range(2)
    ]
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

    first = MessageConsumer(observer(endpoints.kafka_bootstrap), [topic], group_id=group)
    await first.start()
    records = await _collect(first, 10)
    apply(records)
    await first.commit(records[:5])  # the process "crashes" before committing the rest
    await first.stop()
    stored_fence = fence.to_mapping()  # what the service stored atomically with its state

    await _publish(endpoints.kafka_bootstrap, topic, [f"b{i}" for i in range(5)])
    fence = AppliedOffsets.from_mapping(stored_fence)
    second = MessageConsumer(observer(endpoints.kafka_bootstrap), [topic], group_id=group)
    await second.start()
    try:
        redelivered = await _collect(second, 10)
        await second.commit(redelivered)
    finally:
        await second.stop()
    assert [r.offset for r in redelivered][:5] == [5, 6, 7, 8, 9], "uncommitted records come again"
    apply(redelivered)
    assert applied == [f"a{i}" for i in range(10)] + [f"b{i}" for i in range(5)]


async def _replace_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """Delete the topic and create it again: its log begins anew at offset 0 (as after a
    memory-only broker's restart), under the same name."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_topics([topic])
    finally:
        await admin.close()
    assert await ensure_topics(bootstrap, [Topic(topic, partitions, "test key", "test")]) == [topic]


async def _publish_together(bootstrap: str, topic: str, values: list[str]) -> None:
    """Sent without waiting in between, so the broker stores them in multi-record batches."""
    producer = MessageProducer(as_service(bootstrap))
    await producer.start()
    try:
        sent = [
            await producer.enqueue(topic, v, StringValue(value=v).SerializeToString(), partition=0)
            for v in values
        ]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


def _apply_all(fence: AppliedOffsets, records: list[Record], applied: list[str]) -> None:
    for record in records:
        if fence.is_new(record):
            applied.append(record.decode(StringValue).value)
            fence.mark(record)


async def test_a_position_in_the_same_log_stays_whatever_its_batches(endpoints: StackEndpoints) -> None:
    """The log end is read from a fetch reply: the embedded broker's ListOffsets answers the
    start of the last batch plus one, below a position that applied the whole batch."""
    bootstrap = endpoints.kafka_bootstrap
    topic = await _new_topic(bootstrap, 1)
    await _publish_together(bootstrap, topic, [f"a{i}" for i in range(6)])
    consumer = AssignedConsumer(observer(bootstrap), [topic])
    await consumer.start()
    fence, applied = AppliedOffsets(), []
    try:
        _apply_all(fence, await _collect(consumer, 6), applied)
    finally:
        await consumer.stop()
    assert applied == [f"a{i}" for i in range(6)]
    checker = LogPositions(bootstrap)
    try:
        for partial in (AppliedOffsets.from_mapping(fence.to_mapping()), fence):
            assert await checker.check([partial], {(topic, 0)}) == []
        midway = AppliedOffsets()
        _apply_all(midway, (await _read_from(bootstrap, topic, 0))[:3], [])  # inside the batch
        assert await checker.check([midway], {(topic, 0)}) == []
    finally:
        await checker.stop()
    assert fence.position((topic, 0)).next_offset == 6


async def _read_from(bootstrap: str, topic: str, offset: int) -> list[Record]:
    consumer = AssignedConsumer(observer(bootstrap), [topic])
    await consumer.start(AppliedOffsets({(topic, 0): offset}))
    try:
        async for batch in consumer.batches(timeout_ms=500):
            if batch:
                return batch
    finally:
        await consumer.stop()
    return []


async def test_a_replaced_log_is_applied_from_its_start_even_once_it_grew_past_the_position(
    endpoints: StackEndpoints,
) -> None:
    """The offsets alone cannot tell: the new log is longer than the stored position. The
    record before the position is another one, so the position is reset, at start."""
    bootstrap = endpoints.kafka_bootstrap
    topic = await _new_topic(bootstrap, 1)
    await _publish(bootstrap, topic, [f"old{i}" for i in range(5)])
    fence, applied = AppliedOffsets(), []
    first = AssignedConsumer(observer(bootstrap), [topic])
    await first.start(fence)
    try:
        _apply_all(fence, await _collect(first, 5), applied)
    finally:
        await first.stop()
    stored = fence.to_mapping()  # what a service keeps with its state

    await _replace_topic(bootstrap, topic, 1)
    await _publish(bootstrap, topic, [f"new{i}" for i in range(8)])
    fence = AppliedOffsets.from_mapping(stored)
    second = AssignedConsumer(observer(bootstrap), [topic])
    await second.start(fence)  # checks the stored position before reading
    try:
        records = await _collect(second, 8)
    finally:
        await second.stop()
    assert [r.offset for r in records] == list(range(8))
    _apply_all(fence, records, applied)
    assert applied == [f"old{i}" for i in range(5)] + [f"new{i}" for i in range(8)], "nothing skipped"


async def test_a_running_consumer_notices_a_replaced_log_without_traffic_and_a_shorter_one_too(
    endpoints: StackEndpoints,
) -> None:
    """Checked periodically whether or not records arrive: a position beyond a shorter new
    log, and one inside a longer new log, both resume at the new log's start."""
    bootstrap = endpoints.kafka_bootstrap
    topic = await _new_topic(bootstrap, 2)
    producer = MessageProducer(as_service(bootstrap))
    await producer.start()

    async def send(partition: int, value: str) -> None:
        sent = await producer.enqueue(
            topic, value, StringValue(value=value).SerializeToString(), partition=partition
        )
        await sent

    fence, applied = AppliedOffsets(), []
    group = f"g-{uuid.uuid4().hex[:6]}"
    consumer = MessageConsumer(observer(bootstrap), [topic], group_id=group, log_check_interval_s=0.3)
    await consumer.start()
    new_counts = {(topic, 0): 1, (topic, 1): 5}  # shorter than the position 3, and longer
    try:
        for i in range(6):
            await send(i % 2, f"old{i}")
        _apply_all(fence, await _collect(consumer, 6), applied)
        assert {key: fence.position(key).next_offset for key in fence.next_offset} == {
            (topic, 0): 3,
            (topic, 1): 3,
        }
        await _replace_topic(bootstrap, topic, 2)
        for (_, partition), count in new_counts.items():
            for i in range(count):
                await send(partition, f"new{partition}-{i}")
        wanted = {f"new{p}-{i}" for (_, p), count in new_counts.items() for i in range(count)}

        async def until_applied() -> None:
            async for batch in consumer.batches(timeout_ms=200):
                _apply_all(fence, await consumer.follow_log_resets(batch, [fence]), applied)
                if wanted <= set(applied):
                    return

        await asyncio.wait_for(until_applied(), 30)
    finally:
        await consumer.stop()
        await producer.stop()
    assert {key: fence.position(key).next_offset for key in fence.next_offset} == new_counts
