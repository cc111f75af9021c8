"""The durable broker (Tansu 0.6 with its SQLite engine) cannot grant an idempotent producer an id.

aiokafka 0.14 asks with InitProducerId version 0, which has no producer id and epoch fields (Kafka
reads them as -1). Tansu's SQLite engine has no branch for their absence: its storage task
panics ("not yet implemented", an unimplemented match arm), the producer never gets an id, and
from then on the broker answers no client at all (metadata requests fail) until it is restarted.
So Cellpilot's producers are never idempotent on this broker (``CELLPILOT_KAFKA_IDEMPOTENCE``
false: the embedded stack's default, and what ``make images`` writes for the offline image);
this test runs on a stack of its own, which it leaves with a broker that no longer answers.
Should a Tansu grant the id one day, it fails and says to turn the setting on for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from cellpilot.platform.kafka import ensure_topics
from cellpilot.platform.stream_access import WriteDurability, producer_options
from cellpilot.platform.topics import Topic
from cellpilot.stack import Stack
from cellpilot.stack.broker_build import durable_tansu_binary

pytestmark = pytest.mark.timeout(300 if durable_tansu_binary() else 3600)
GRANT_TIMEOUT_S = 15.0


async def test_the_durable_broker_grants_no_producer_id(durable_stack: Stack) -> None:
    admin = durable_stack.endpoints.broker_admin()
    topic = f"test.idempotent.{uuid.uuid4().hex[:8]}"
    await ensure_topics(admin, [Topic(topic, 1, "key", "test")])
    idempotent = dataclasses.replace(admin, durability=WriteDurability(idempotence=True))
    producer = AIOKafkaProducer(**producer_options(idempotent), request_timeout_ms=5000)
    # The request's connection is lost, and every login after it fails: aiokafka retries until
    # the timeout, or gives up on the broker's SCRAM error (a KeyError, tests in
    # test_durable_broker.py), or on the lost connection (a KafkaError).
    refused = (TimeoutError, KafkaError, KeyError)
    try:
        with pytest.raises(refused):
            await _start_and_write(producer, topic)
    finally:
        with contextlib.suppress(KeyError):  # stopping updates metadata: that login fails too
            await producer.stop()
    with pytest.raises(refused):  # the warning above: nobody is served any more
        async with asyncio.timeout(GRANT_TIMEOUT_S):
            await ensure_topics(admin, [Topic(f"{topic}.after", 1, "key", "test")])


async def _start_and_write(producer: AIOKafkaProducer, topic: str) -> None:
    async with asyncio.timeout(GRANT_TIMEOUT_S):
        await producer.start()
        await producer.send_and_wait(topic, b"written")
    pytest.fail(
        "the durable Tansu granted a producer id: turn CELLPILOT_KAFKA_IDEMPOTENCE on for it "
        "(the embedded stack's stack.env, infra/images/build_images.sh)"
    )
