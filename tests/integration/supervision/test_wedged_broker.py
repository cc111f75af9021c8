"""A broker whose process runs but answers nothing is restarted by ``cellpilot run``'s watchdog
(cellpilot.stack.broker_probe). The durable Tansu 0.6 gets so after one idempotent producer's
InitProducerId (tests/integration/broker/test_durable_broker_idempotence.py): any client that can
log in can do it to the stack's broker."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from run_command import cellpilot, run_args, run_env, three_free_ports, unit_status, wait_for

from cellpilot.platform.kafka import ensure_topics
from cellpilot.platform.stream_access import WriteDurability, producer_options
from cellpilot.platform.topics import Topic
from cellpilot.stack import StackEndpoints
from cellpilot.stack.broker_build import durable_tansu_binary
from cellpilot.stack.config import BROKER_ENV

pytestmark = pytest.mark.timeout(600)


async def _wedge(endpoints: StackEndpoints) -> None:
    """An idempotent producer's InitProducerId: the broker's storage task panics."""
    admin = endpoints.broker_admin()
    idempotent = dataclasses.replace(admin, durability=WriteDurability(idempotence=True))
    producer = AIOKafkaProducer(**producer_options(idempotent), request_timeout_ms=5000)
    with contextlib.suppress(TimeoutError, KafkaError, KeyError):
        async with asyncio.timeout(15):
            await producer.start()
            await producer.send_and_wait(f"test.wedge.{uuid.uuid4().hex[:8]}", b"x")
    with contextlib.suppress(KafkaError, KeyError):
        await producer.stop()


def test_a_broker_that_answers_nothing_is_restarted(tmp_path_factory: pytest.TempPathFactory) -> None:
    if durable_tansu_binary() is None:
        pytest.skip("the durable broker is not built (make broker)")
    data_dir = tmp_path_factory.mktemp("run-wedged")
    env = {**run_env(three_free_ports()), BROKER_ENV: "durable"}
    started = cellpilot(*run_args(data_dir, "--detach"), env=env)
    assert started.returncode == 0, started.stderr
    try:
        endpoints = StackEndpoints.read_env_file(data_dir / "stack.env")
        before = unit_status(data_dir, "kafka")
        asyncio.run(_wedge(endpoints))
        topic = Topic(f"test.after.{uuid.uuid4().hex[:8]}", 1, "key", "test")

        async def create() -> list[str]:
            async with asyncio.timeout(10):
                return await ensure_topics(endpoints.broker_admin(), [topic])

        with pytest.raises((TimeoutError, KafkaError, KeyError)):  # wedged: it answers nobody
            asyncio.run(create())

        def restarted() -> bool:
            now = unit_status(data_dir, "kafka")
            return now.pid != before.pid and now.state == "running"

        wait_for(restarted, 180, "the silent broker to be restarted")
        log = (data_dir / "logs" / "run.log").read_text()
        assert "has answered no request" in log, log[-2000:]
        assert asyncio.run(create()) == [topic.name], "it answers again"
    finally:
        stopped = cellpilot("stop", "--data-dir", str(data_dir), timeout=60)
        assert stopped.returncode == 0, stopped.stderr
