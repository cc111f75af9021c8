"""How tests reach the streams: as a service (signing with its record-signing key) or as an observer.

The session stack's certificates directory (``CELLPILOT_CERTS_DIR``, exported by the
``embedded_stack`` fixture) holds every service identity's record-signing key, so a test writes a
topic as the service the producer table allows on it, and reads it checking every record, as the
services do. The platform's own tests of the Kafka wrappers use topics named ``test.<id>``: a
stream the test verifier lets the ``recommender`` identity write (:data:`TEST_WRITER`).
"""

from __future__ import annotations

import os
from pathlib import Path

from google.protobuf.message import Message

from cellpilot.platform.kafka import MessageProducer
from cellpilot.platform.stream_access import StreamAccess
from cellpilot.platform.topics import Topic, stream_of
from cellpilot.security.record_signing import RecordSigner, RecordVerifier

TEST_WRITER = "recommender"
TEST_STREAM = Topic("test", 1, "test key", "the Kafka wrappers' tests", writers=(TEST_WRITER,))


def certs_dir() -> Path:
    return Path(os.environ["CELLPILOT_CERTS_DIR"])


def test_stream(name: str) -> Topic | None:
    """The declared streams, and ``test.<id>`` topics written by :data:`TEST_WRITER`."""
    return TEST_STREAM if name.startswith("test.") else stream_of(name)


def as_service(bootstrap: str, identity: str = TEST_WRITER) -> StreamAccess:
    """Writes as ``identity`` and checks what it reads, like that service."""
    return StreamAccess(
        bootstrap, RecordVerifier.load(certs_dir(), test_stream), RecordSigner.load(certs_dir(), identity)
    )


def observer(bootstrap: str) -> StreamAccess:
    """Checks every record it reads and writes nothing (files no refusal)."""
    return StreamAccess(bootstrap, RecordVerifier.load(certs_dir(), test_stream))


# The identity a test writes a stream as: the first writer the producer table names (a Borglet:
# the suite's Borglet identity, whose certificate covers every machine).
TEST_IDENTITIES = {"borglet": "borglet-test"}


def writer_identity(topic: str) -> str:
    stream = test_stream(topic)
    assert stream is not None, f"{topic} is no stream a test can write"
    kind = stream.writers[0]
    return TEST_IDENTITIES.get(kind, kind)


class StreamWriter:
    """Writes any stream as the service the producer table allows on it: one signed producer
    per identity, with MessageProducer's ``send``/``send_raw``."""

    def __init__(self, bootstrap: str, client_id: str = "test-writer") -> None:
        self.bootstrap = bootstrap
        self.client_id = client_id
        self._producers: dict[str, MessageProducer] = {}

    async def _producer(self, topic: str) -> MessageProducer:
        identity = writer_identity(topic)
        if identity not in self._producers:
            producer = MessageProducer(as_service(self.bootstrap, identity), client_id=self.client_id)
            await producer.start()
            self._producers[identity] = producer
        return self._producers[identity]

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        for producer in self._producers.values():
            await producer.stop()
        self._producers.clear()

    async def send(self, topic: str, key: str, message: Message) -> int:
        return await (await self._producer(topic)).send(topic, key, message)

    async def send_raw(self, topic: str, key: str, value: bytes) -> None:
        await (await self._producer(topic)).send_raw(topic, key, value)
