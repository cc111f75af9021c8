"""The durable broker (Tansu with its SQLite storage engine, ``make broker``) in an embedded stack.

What it adds over the in-memory broker: its log survives a restart of the broker, and it admits
only its SCRAM-SHA-512 users (one per service account and ``admin``), so an anonymous client or
a wrong password is refused and each service connects as its own user.

The binary is built here when it is missing and ``cargo`` is at hand (20-30 minutes, once); the
tests skip, saying why, only when neither is.
"""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from cellpilot.platform.kafka import ensure_topics
from cellpilot.platform.settings import PlatformSettings
from cellpilot.platform.stream_access import BrokerLogin, StreamAccess, WriteDurability
from cellpilot.platform.topics import SERVICE_KINDS, Topic
from cellpilot.stack import Stack, StackConfig, supervisor
from cellpilot.stack.broker_build import durable_tansu_binary
from cellpilot.stack.broker_users import create_broker_users, refused_logins
from cellpilot.stack.config import port_in_use
from cellpilot.stack.kafka_access import BROKER_USERS
from cellpilot.stack.processes import StopRequest, stop_processes

REFUSAL_TIMEOUT_S = 30.0
# The first test's setup may build the broker (make broker): 20-30 minutes on two cores.
pytestmark = pytest.mark.timeout(300 if durable_tansu_binary() else 3600)


def _admin(stack: Stack) -> StreamAccess:
    return stack.endpoints.broker_admin()


async def _write(access: StreamAccess, topic: str, values: list[bytes]) -> None:
    producer = AIOKafkaProducer(**access.client_options(), acks="all")
    await producer.start()
    try:
        for value in values:
            await producer.send_and_wait(topic, value, key=b"k")
    finally:
        await producer.stop()


async def _read_all(access: StreamAccess, topic: str, count: int) -> list[bytes]:
    """The first ``count`` records of partition 0, from offset 0 (fails after 30 s)."""
    reader = AIOKafkaConsumer(**access.client_options(), enable_auto_commit=False)
    await reader.start()
    try:
        tp = TopicPartition(topic, 0)
        reader.assign([tp])
        reader.seek(tp, 0)
        got: list[bytes] = []
        async with asyncio.timeout(30):
            while len(got) < count:
                for records in (await reader.getmany(timeout_ms=500)).values():
                    got += [r.value for r in records if r.value is not None]
        return got
    finally:
        await reader.stop()


def _restart_broker(stack: Stack) -> None:
    """What the supervisor does when the broker dies: start it again (and check its topics)."""
    handle = stack.handle("kafka")
    assert handle is not None
    stop_processes([StopRequest("kafka", handle, signal.SIGTERM, group=False)], grace_s=10)
    deadline = time.monotonic() + 20
    while port_in_use(stack.config.host, stack.config.kafka_port):
        assert time.monotonic() < deadline, "the broker's port was not released"
        time.sleep(0.05)
    stack.restart_component("kafka")


def test_the_stack_runs_the_durable_broker_with_scram(durable_stack: Stack) -> None:
    config = durable_stack.config
    kafka = durable_stack.component("kafka")
    assert kafka.argv[0] == str(durable_tansu_binary())
    assert "--authentication" in kafka.argv
    assert config.broker_db.exists()
    written = PlatformSettings.load(config.env_path)
    assert written.kafka_security_protocol == "SASL_PLAINTEXT"
    assert written.kafka_sasl_mechanism == "SCRAM-SHA-512"
    # acks=all, never idempotent: this broker cannot grant a producer id
    # (test_durable_broker_idempotence.py).
    assert written.write_durability() == WriteDurability(idempotence=False, replication_factor=1)


async def test_a_record_survives_a_broker_restart(durable_stack: Stack) -> None:
    admin = _admin(durable_stack)
    topic = f"test.durable.{uuid.uuid4().hex[:8]}"
    assert await ensure_topics(admin, [Topic(topic, 1, "key", "test")]) == [topic]
    await _write(admin, topic, [b"before-1", b"before-2"])
    await asyncio.to_thread(_restart_broker, durable_stack)
    assert await _read_all(admin, topic, 2) == [b"before-1", b"before-2"], "the log came back"
    await _write(admin, topic, [b"after"])
    assert await _read_all(admin, topic, 3) == [b"before-1", b"before-2", b"after"], "offsets go on"


async def _refused(login: BrokerLogin, bootstrap: str) -> BaseException:
    """The error a producer with ``login`` gets trying to write (an assertion if it wrote)."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, request_timeout_ms=5000, **login.client_options()
    )
    try:
        async with asyncio.timeout(REFUSAL_TIMEOUT_S):
            await producer.start()
            await producer.send_and_wait("test.refused", b"should not be written")
    # A refused login: aiokafka 0.14 does not read the server's SCRAM error ("e=invalid-proof",
    # "e=unknown-user") and fails with KeyError('v'); an anonymous client is disconnected.
    except (KafkaError, OSError, TimeoutError, KeyError) as error:
        return error
    finally:
        await producer.stop()
    raise AssertionError(f"the broker took a record from {login.username or 'an anonymous client'}")


async def test_anonymous_and_wrong_password_clients_are_refused(durable_stack: Stack) -> None:
    bootstrap = durable_stack.endpoints.kafka_bootstrap
    anonymous = await _refused(BrokerLogin(), bootstrap)
    assert isinstance(anonymous, KafkaError), repr(anonymous)
    wrong = BrokerLogin("SASL_PLAINTEXT", "SCRAM-SHA-512", "aggregator", "not-its-password")
    assert isinstance(await _refused(wrong, bootstrap), KeyError), "the server's final message had no proof"
    unknown = BrokerLogin("SASL_PLAINTEXT", "SCRAM-SHA-512", "nobody", "anything")
    assert isinstance(await _refused(unknown, bootstrap), KeyError | KafkaError)


async def test_each_service_connects_as_its_own_user(durable_stack: Stack) -> None:
    """Every service's login, as its settings build it from ``stack.env`` and its password file."""
    settings = PlatformSettings.load(durable_stack.config.env_path)
    topic = f"test.service-users.{uuid.uuid4().hex[:8]}"
    await ensure_topics(_admin(durable_stack), [Topic(topic, 1, "key", "test")])
    for service in SERVICE_KINDS:
        login = settings.broker_login(service)
        assert login.username == service
        assert login.protocol == "SASL_PLAINTEXT"
        await _write(StreamAccess.admin(settings.kafka_bootstrap, login), topic, [service.encode()])
    got = await _read_all(_admin(durable_stack), topic, len(SERVICE_KINDS))
    assert got == [s.encode() for s in SERVICE_KINDS]


async def _readable(access: StreamAccess, topic: str) -> list[bytes]:
    """What a reader from offset 0 of partition 0 gets within 2 s of the first fetch reply (the
    broker's ListOffsets keeps answering 0 for the log start after the engine deleted records)."""
    reader = AIOKafkaConsumer(**access.client_options(), enable_auto_commit=False)
    await reader.start()
    try:
        tp = TopicPartition(topic, 0)
        reader.assign([tp])
        reader.seek(tp, 0)
        got: list[bytes] = []
        async with asyncio.timeout(30):
            while reader.highwater(tp) is None:
                for records in (await reader.getmany(timeout_ms=200)).values():
                    got += [r.value for r in records if r.value is not None]
        for records in (await reader.getmany(timeout_ms=2000)).values():
            got += [r.value for r in records if r.value is not None]
        return got
    finally:
        await reader.stop()


async def test_the_engine_enforces_retention_ms(durable_stack: Stack) -> None:
    """Records older than a topic's retention.ms go at a maintenance pass (every 30 s here); a
    topic without one keeps its records (how the stack's kept topics are made)."""
    admin = _admin(durable_stack)
    suffix = uuid.uuid4().hex[:8]
    short, kept = (
        Topic(f"test.short.{suffix}", 1, "key", "test", retention_ms=1_000),
        Topic(f"test.kept.{suffix}", 1, "key", "test"),
    )
    await ensure_topics(admin, [short, kept])
    for topic in (short, kept):
        await _write(admin, topic.name, [b"old-1", b"old-2"])
    deadline = time.monotonic() + 120  # a few maintenance passes
    while left := await _readable(admin, short.name):
        assert time.monotonic() < deadline, f"the expired records are still there: {left}"
        await asyncio.sleep(1)
    assert await _readable(admin, kept.name) == [b"old-1", b"old-2"]


def test_a_user_the_broker_did_not_store_is_created_again(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`tansu user create` exits 0 whatever the broker answered: a user whose upsert failed goes
    unnoticed until its service cannot log in. Fault injection: the first creation leaves out
    ``borglet``, as if its upsert had failed; the stack finds the refused login and creates it again."""
    if durable_tansu_binary() is None:
        pytest.skip("the durable broker is not built (make broker)")
    created: list[tuple[str, ...]] = []

    def losing_borglet_once(config: StackConfig, log: Path, users: tuple[str, ...] = BROKER_USERS) -> None:
        created.append(users)
        first = len(created) == 1
        create_broker_users(config, log, tuple(u for u in users if u != "borglet") if first else users)

    monkeypatch.setattr(supervisor, "create_broker_users", losing_borglet_once)
    stack = Stack(StackConfig(tmp_path_factory.mktemp("user-lost"), broker="durable"))
    said: list[str] = []
    stack.up(said.append)
    try:
        assert created == [BROKER_USERS, ("borglet",)], "created again: the refused user only"
        assert any("refused the logins of borglet" in line for line in said), said
        settings = PlatformSettings.load(stack.config.env_path)
        login = settings.broker_login("borglet")
        assert refused_logins(settings.kafka_bootstrap, {"borglet": login.password}) == []
    finally:
        stack.down()
