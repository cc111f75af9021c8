"""Entry points of the local infrastructure images (``python -m cellpilot.stack.container ...``).

The same server binaries as the embedded stack (see :mod:`cellpilot.stack.components`),
started the way the official images start them, so docker-compose.yml works with either:

* ``kafka``: Tansu on 0.0.0.0:9092, advertising ``$ADVERTISED_LISTENER_URL``. The durable
  build (``DURABLE_BROKER``, when ``make images`` found it built) keeps its log in SQLite on the
  kafka-data volume and admits only its SCRAM users, created before it listens; without it, the
  in-memory build, which loses its log on every restart and authenticates no one. Every start
  creates Cellpilot's topics (idempotent) and only then marks the broker ready
  (``TOPICS_READY``, which the ``cellpilot-healthcheck kafka`` check reads);
* ``database``: as the superuser (the ``admin`` store password), create the database, apply
  the migrations and give the service roles LOGIN and their passwords: compose's one-shot
  ``postgres-setup``, after which each service connects as its own role;
* ``topics``: create Cellpilot's Kafka topics on ``$CELLPILOT_KAFKA_BOOTSTRAP`` (idempotent,
  retried while the broker starts), the one-shot ``kafka-topics`` service of the compose file,
  logged in as ``admin`` where the broker authenticates (``CELLPILOT_KAFKA_SECURITY_PROTOCOL``),
  each with ``$CELLPILOT_KAFKA_REPLICATION_FACTOR`` replicas (3 on docker-compose.kafka-ha.yml's
  brokers, which also refuse a topic until all three have registered: the job retries);
* ``secrets``: copy each container's share of the certificates directory into its own volume
  (:mod:`cellpilot.stack.compose_secrets`), after compose's one-shot ``certs`` issued them;
* ``link-redis-tools``: put ``redis-server`` and ``redis-cli`` on PATH at image build time.

(PostgreSQL runs replicated, from Debian's packages under Patroni: infra/images/postgres-ha.)
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from cellpilot.platform.stream_access import Broker, bootstrap_of
from cellpilot.stack import components

T = TypeVar("T")

LINK_DIR = Path("/usr/local/bin")
TOPICS_READY = Path("/tmp/cellpilot-topics-ready")
# The offline image's durable broker: the binary `make broker` built, copied in by `make images`
# (infra/images/build_images.sh); its SQLite log on the kafka-data volume; the SCRAM users'
# passwords in the secrets-kafka-users volume (cellpilot.stack.compose_secrets).
DURABLE_BROKER = Path("/opt/tansu-durable/tansu")
BROKER_DATA = Path(os.environ.get("CELLPILOT_BROKER_DATA", "/var/lib/tansu"))
BROKER_USERS_DIR = Path("/users")
SETUP_PORT = 19092  # the users are created on the container's loopback, before the broker listens


def _link(target: Path, name: str) -> None:
    link = LINK_DIR / name
    link.unlink(missing_ok=True)
    link.symlink_to(target)


def kafka() -> None:
    advertised = os.environ.get("ADVERTISED_LISTENER_URL", "tcp://localhost:9092")
    TOPICS_READY.unlink(missing_ok=True)
    listen = ["broker", "--listener-url", "tcp://0.0.0.0:9092", "--advertised-listener-url", advertised]
    if DURABLE_BROKER.is_file():
        broker, access = _durable_broker(listen)
    else:
        from cellpilot.stack.broker_build import FALLBACK_WARNING

        print(f"kafka: {FALLBACK_WARNING} (this image was built without `make broker`)", flush=True)
        broker, access = subprocess.Popen([str(components.tansu_binary()), *listen]), "127.0.0.1:9092"
    signal.signal(signal.SIGTERM, lambda *_: broker.terminate())
    signal.signal(signal.SIGINT, lambda *_: broker.terminate())
    _create_topics(access, running=lambda: broker.poll() is None)
    TOPICS_READY.touch()
    sys.exit(_watch(broker, access))


def _watch(broker: subprocess.Popen[bytes], access: Broker) -> int:
    """Waits for the broker to exit; one that runs but answers nothing for ``SILENT_LIMIT_S`` is
    killed (cellpilot.stack.broker_probe), so the container exits and compose restarts it."""
    from cellpilot.platform.stream_access import BrokerLogin, StreamAccess
    from cellpilot.stack.broker_probe import PROBE_EVERY_S, SILENT_LIMIT_S, broker_answers

    probe = access if isinstance(access, StreamAccess) else StreamAccess.admin(access, BrokerLogin())
    silent_since: float | None = None
    while True:
        try:
            return broker.wait(PROBE_EVERY_S)
        except subprocess.TimeoutExpired:
            pass
        if broker_answers(probe):
            silent_since = None
            continue
        silent_since = silent_since or time.monotonic()
        if time.monotonic() - silent_since >= SILENT_LIMIT_S:
            print(f"kafka: no answer from the broker for {SILENT_LIMIT_S:.0f} s: killing it", flush=True)
            broker.kill()
            return broker.wait()


def _durable_broker(listen: list[str], attempts: int = 3) -> tuple[subprocess.Popen[bytes], Broker]:
    """The durable broker on its volume (``BROKER_DATA``), started after creating the SCRAM users
    of the passwords in ``BROKER_USERS_DIR`` and once each of them logs in (a refused user is
    created again: cellpilot.stack.broker_users), and the admin's login for creating the topics."""
    from cellpilot.platform.stream_access import BrokerLogin, StreamAccess
    from cellpilot.security.store_secrets import ADMIN_ACCOUNT, read_store_password
    from cellpilot.stack.broker_users import create_users, refused_logins
    from cellpilot.stack.config import port_in_use
    from cellpilot.stack.kafka_access import BROKER_USERS

    BROKER_DATA.mkdir(parents=True, exist_ok=True)
    storage = [
        "--storage-engine",
        f"sqlite://broker.db?maintenance_interval={components.DURABLE_MAINTENANCE_INTERVAL}",
    ]
    setup_url = f"tcp://127.0.0.1:{SETUP_PORT}"
    setup = [
        str(DURABLE_BROKER),
        "broker",
        "--listener-url",
        setup_url,
        "--advertised-listener-url",
        setup_url,
    ]
    passwords = {user: read_store_password(BROKER_USERS_DIR, user) for user in BROKER_USERS}
    env = {**os.environ, "RUST_LOG": "warn"}
    pending = dict(passwords)
    for attempt in range(1, attempts + 1):
        create_users([*setup, *storage], ("127.0.0.1", SETUP_PORT), pending, BROKER_DATA / "users.log",
                     cwd=BROKER_DATA, env=env)  # fmt: skip
        broker = subprocess.Popen(
            [str(DURABLE_BROKER), *listen, *storage, "--authentication"], cwd=BROKER_DATA, env=env
        )
        while not port_in_use("127.0.0.1", 9092):
            if broker.poll() is not None:
                raise SystemExit(f"kafka: the durable broker exited ({broker.returncode}) before it listened")
            time.sleep(0.1)
        refused = refused_logins("127.0.0.1:9092", pending)
        if not refused:
            print(
                f"kafka: durable broker, log in {BROKER_DATA / 'broker.db'}, users {', '.join(passwords)}",
                flush=True,
            )
            admin = BrokerLogin("SASL_PLAINTEXT", "SCRAM-SHA-512", ADMIN_ACCOUNT, passwords[ADMIN_ACCOUNT])
            return broker, StreamAccess.admin("127.0.0.1:9092", admin)
        print(f"kafka: WARNING: refused the logins of {', '.join(refused)} (attempt {attempt})", flush=True)
        broker.terminate()
        broker.wait(30)
        pending = {user: passwords[user] for user in refused}
    raise SystemExit(f"kafka: the durable broker refused {', '.join(pending)} after {attempts} attempts")


def link_redis_tools() -> None:
    server = components.redis_server_binary()
    _link(server, "redis-server")
    _link(server.parent / "redis-cli", "redis-cli")


def topics() -> None:
    from cellpilot.platform.settings import PlatformSettings
    from cellpilot.platform.stream_access import StreamAccess
    from cellpilot.security.store_secrets import ADMIN_ACCOUNT

    settings = PlatformSettings.load()
    admin = settings.broker_login(ADMIN_ACCOUNT)
    _create_topics(StreamAccess.admin(settings.kafka_bootstrap, admin, settings.write_durability()))


def secrets(bundles_root: Path = Path("/bundles")) -> None:
    from cellpilot.platform.settings import PlatformSettings
    from cellpilot.stack.compose_secrets import distribute

    for line in distribute(PlatformSettings.load().certs_dir, bundles_root):
        print(f"secrets-{line}", flush=True)


def database(attempts: int = 60, interval_s: float = 1.0) -> None:
    import asyncpg
    from sqlalchemy.exc import DBAPIError

    from cellpilot.platform.postgres import apply_migrations, ensure_database
    from cellpilot.platform.settings import PlatformSettings
    from cellpilot.platform.store_accounts import admin_postgres_url, provision_postgres_roles

    settings = PlatformSettings.load()
    url = admin_postgres_url(settings.postgres_url, settings.certs_dir)

    async def prepare() -> list[str]:
        await ensure_database(url)
        await apply_migrations(url)
        return await provision_postgres_roles(url, settings.certs_dir)

    _retrying(
        lambda: asyncio.run(prepare()),
        what="postgres",
        goal="prepare the database",
        done=lambda roles: f"migrated; roles with their passwords: {', '.join(roles)}",
        # The server may still be starting; a replicated one may have no primary yet, or
        # Patroni may not have set the superuser's password yet (its health check passes first).
        retried=(OSError, DBAPIError, asyncpg.PostgresError, asyncpg.InterfaceError),
        attempts=attempts,
        interval_s=interval_s,
    )


def _create_topics(
    broker: Broker, attempts: int = 60, interval_s: float = 1.0, running: Callable[[], bool] = lambda: True
) -> None:
    from cellpilot.platform.kafka import ensure_topics

    bootstrap = bootstrap_of(broker)
    _retrying(
        lambda: asyncio.run(ensure_topics(broker)),
        what=f"topics on {bootstrap}",
        goal=f"create the topics on {bootstrap}",
        done=lambda created: f"created {created or 'none (all exist)'}",
        retried=(Exception,),  # the broker may still be starting; anything else repeats too
        attempts=attempts,
        interval_s=interval_s,
        running=running,
    )


def _retrying(
    action: Callable[[], T],
    *,
    what: str,
    goal: str,
    done: Callable[[T], str],
    retried: tuple[type[Exception], ...],
    attempts: int,
    interval_s: float,
    running: Callable[[], bool] = lambda: True,
) -> None:
    """Runs ``action`` until it succeeds, ``interval_s`` apart, printing each failed attempt and
    then what it did; stops quietly once ``running()`` is false, exits after ``attempts`` failures."""
    for attempt in range(1, attempts + 1):
        if not running():
            return
        try:
            result = action()
        except retried as error:
            print(f"{what}: attempt {attempt} failed: {error!r}", flush=True)
            time.sleep(interval_s)
            continue
        print(f"{what}: {done(result)}", flush=True)
        return
    raise SystemExit(f"could not {goal} after {attempts} attempts")


COMMANDS = {
    "kafka": kafka,
    "database": database,
    "topics": topics,
    "secrets": secrets,
    "link-redis-tools": link_redis_tools,
}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in COMMANDS:
        raise SystemExit(f"usage: python -m cellpilot.stack.container {'|'.join(COMMANDS)}")
    COMMANDS[sys.argv[1]]()
