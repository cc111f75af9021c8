"""A consumer-group member cut off mid-run loses its partitions to the live members, on the durable
broker too (cellpilot.platform.abandoned_partitions: Tansu's SQLite engine drops the silent
member but does not hand its partitions on by itself)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pytest
from aiokafka import AIOKafkaProducer

from cellpilot.platform.kafka import ensure_topics
from cellpilot.platform.kafka_consumers import MessageConsumer
from cellpilot.platform.topics import Topic
from cellpilot.stack import Stack, StackConfig
from cellpilot.stack.broker_build import durable_tansu_binary

pytestmark = pytest.mark.timeout(300)
PARTITIONS = 4

# A plain member of the group in a process of its own, so that SIGSTOP can silence it as a cut
# network would: it reads and commits what it read.
MEMBER = """
import asyncio, json, sys
from aiokafka import AIOKafkaConsumer
options = json.loads(sys.argv[1])
async def main():
    member = AIOKafkaConsumer(sys.argv[2], group_id=sys.argv[3], enable_auto_commit=False,
                              auto_offset_reset="earliest", session_timeout_ms=10000,
                              heartbeat_interval_ms=1000, **options)
    await member.start()
    while True:
        fetched = await member.getmany(timeout_ms=200)
        if fetched:
            await member.commit()
        print(json.dumps(sorted(tp.partition for tp in member.assignment())), flush=True)
asyncio.run(main())
"""


@pytest.fixture
def durable(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    if durable_tansu_binary() is None:
        pytest.skip("the durable broker is not built (make broker)")
    stack = Stack(StackConfig(tmp_path_factory.mktemp("takeover"), broker="durable"))
    stack.up()
    yield stack
    stack.down()


async def _produce(options: dict[str, object], topic: str, rounds: int) -> None:
    producer = AIOKafkaProducer(**options, acks="all")
    await producer.start()
    try:
        for i in range(rounds):
            for p in range(PARTITIONS):
                await producer.send_and_wait(topic, f"r{i}".encode(), key=b"k", partition=p)
    finally:
        await producer.stop()


async def test_a_member_cut_off_loses_its_partitions_to_the_live_member(durable: Stack) -> None:
    admin = durable.endpoints.broker_admin()
    topic, group = f"test.takeover.{uuid.uuid4().hex[:8]}", f"takeover-{uuid.uuid4().hex[:8]}"
    await ensure_topics(admin, [Topic(topic, PARTITIONS, "key", "test")])
    options = admin.client_options()
    member = await asyncio.create_subprocess_exec(
        sys.executable, "-c", MEMBER, json.dumps(options), topic, group,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy(),
    )  # fmt: skip
    live = MessageConsumer(admin, [topic], group_id=group, client_id="live", abandoned_after_s=5)
    await live.start()
    batches = live.batches(timeout_ms=200)
    try:

        async def until(condition: object, within: float, what: str) -> None:
            deadline = time.monotonic() + within
            async for batch in batches:
                await live.commit(batch)
                if condition():  # type: ignore[operator]
                    return
                assert time.monotonic() < deadline, f"timed out after {within} s waiting for {what}"

        await until(lambda: 0 < len(live.assignment()) < PARTITIONS, 60, "the two members sharing the topic")
        await _produce(options, topic, 3)
        member.send_signal(signal.SIGSTOP)  # cut off: no heartbeat, no commit, no leave
        await _produce(options, topic, 3)
        await until(lambda: len(live.assignment()) == PARTITIONS, 120, "every partition with the live member")
        assert live.rejoins >= 1, "the live member rejoined over the abandoned partitions"
    finally:
        member.kill()
        await member.wait()
        await live.stop()
