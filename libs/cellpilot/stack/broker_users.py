"""The durable broker's SCRAM users: one per service account and ``admin``, each with the password
of its ``<account>.password`` file (:data:`cellpilot.stack.kafka_access.BROKER_USERS`, the same
users and passwords as the registry path's Kafka).

Tansu keeps its users in its storage (the stack's ``kafka/broker.db``) and creates them only
through the Kafka protocol (AlterUserScramCredentials, ``tansu user create``), which a broker
started with ``--authentication`` answers only for a client that has logged in. So before each
start of the stack's broker, the same binary runs on the same file without authentication, on a
free loopback port nobody has been told about, for as long as creating the users takes (about
a second); then it stops and the real broker starts with ``--authentication``. Creating a user
that exists sets its password again, so a rotated password file takes effect at the next start.

``tansu user create`` exits 0 whatever the broker answered (it does not read the response's
per-user error codes), so a user whose upsert failed in the storage goes unnoticed until that
service cannot log in. So once the real broker listens, :func:`refused_logins` logs in as every
user; the stack creates the refused ones again (cellpilot.stack.supervisor).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from cellpilot.security.store_secrets import read_store_password
from cellpilot.stack import components
from cellpilot.stack.config import StackConfig, free_port
from cellpilot.stack.kafka_access import BROKER_USERS, SCRAM_ITERATIONS
from cellpilot.stack.processes import listens

SETUP_TIMEOUT_S = 30.0


def create_broker_users(config: StackConfig, log: Path, users: tuple[str, ...] = BROKER_USERS) -> None:
    """Create (or set again) every user of ``users`` in ``config``'s durable broker storage."""
    config.broker_db.parent.mkdir(parents=True, exist_ok=True)
    setup = replace(config, kafka_port=free_port(config.host))
    component = components.broker(setup, authentication=False)
    passwords = {user: read_store_password(config.certs_dir, user) for user in users}
    create_users(component.argv, (setup.host, setup.kafka_port), passwords, log,
                 cwd=config.data_dir, env=component.env)  # fmt: skip


def create_users(
    unauthenticated_argv: list[str],
    listening_on: tuple[str, int],
    passwords: Mapping[str, str],
    log: Path,
    cwd: Path,
    env: Mapping[str, str] | None = None,
) -> None:
    """Start the broker of ``unauthenticated_argv`` (no ``--authentication``, listening on
    ``listening_on`` only), create each user of ``passwords`` through it, and stop it. The stack
    and the offline compose image's broker container both create their users so."""
    host, port = listening_on
    with open(log, "ab") as sink:
        process = subprocess.Popen(
            unauthenticated_argv,
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **(env or {})},
            cwd=cwd,
        )
        try:
            deadline = time.monotonic() + SETUP_TIMEOUT_S
            while not listens(process.pid, host, port):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the durable broker did not start to create its users: see {log}")
                time.sleep(0.05)
            for user, password in passwords.items():
                # The password is on this command line for the moment the command runs: tansu
                # takes it no other way (docs/security.md).
                subprocess.run(
                    [unauthenticated_argv[0], "user", "create", "--broker", f"tcp://{host}:{port}",
                     "--mechanism", "scram512", "--iterations", str(SCRAM_ITERATIONS),
                     # "--": a password may start with "-" (URL-safe base64)
                     "--", user, password],
                    check=True, stdout=sink, stderr=subprocess.STDOUT, timeout=SETUP_TIMEOUT_S,
                )  # fmt: skip
        finally:
            process.terminate()
            process.wait(SETUP_TIMEOUT_S)


async def _refused(bootstrap: str, user: str, password: str) -> bool:
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaError

    from cellpilot.platform.stream_access import BrokerLogin, StreamAccess, producer_options

    # Never idempotent (the default WriteDurability): asked for a producer id, this broker's
    # SQLite engine stops serving (cellpilot.platform.stream_access.WriteDurability).
    login = BrokerLogin("SASL_PLAINTEXT", "SCRAM-SHA-512", user, password)
    producer = AIOKafkaProducer(
        **producer_options(StreamAccess.admin(bootstrap, login)),
        request_timeout_ms=int(SETUP_TIMEOUT_S * 1000),
    )
    try:
        await producer.start()
    # aiokafka 0.14 fails a refused SCRAM login with KeyError('v'): it does not read "e=...".
    except (KafkaError, KeyError, ValueError):
        return True
    finally:
        await producer.stop()
    return False


def refused_logins(bootstrap: str, passwords: Mapping[str, str]) -> list[str]:
    """The users of ``passwords`` that the authenticating broker at ``bootstrap`` refuses."""

    async def check() -> list[str]:
        return [user for user, password in passwords.items() if await _refused(bootstrap, user, password)]

    return asyncio.run(check())
