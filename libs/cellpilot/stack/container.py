"""Entry points of the local infrastructure images (``python -m cellpilot.stack.container ...``).

The same server binaries as the embedded stack (see :mod:`cellpilot.stack.components`),
started the way the official images start them, so docker-compose.yml works with either:

* ``kafka``: Tansu on 0.0.0.0:9092, advertising ``$ADVERTISED_LISTENER_URL``;
* ``postgres``: initdb on first start (``$POSTGRES_USER``, ``$POSTGRES_PASSWORD``,
  ``$POSTGRES_DB``, data in ``$PGDATA``), then the server on 0.0.0.0:5432 as user postgres;
* ``link-postgres-tools`` / ``link-redis-tools``: put ``pg_isready``, ``redis-server`` and
  ``redis-cli`` on PATH at image build time.
"""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cellpilot.stack import components

LINK_DIR = Path("/usr/local/bin")


def _link(target: Path, name: str) -> None:
    link = LINK_DIR / name
    link.unlink(missing_ok=True)
    link.symlink_to(target)


def kafka() -> None:
    advertised = os.environ.get("ADVERTISED_LISTENER_URL", "tcp://localhost:9092")
    binary = str(components.tansu_binary())
    os.execv(
        binary,
        [binary, "broker", "--listener-url", "tcp://0.0.0.0:9092", "--advertised-listener-url", advertised],
    )


def postgres() -> None:
    data = Path(os.environ.get("PGDATA", "/var/lib/postgresql/data"))
    user = os.environ.get("POSTGRES_USER", "postgres")
    password = os.environ.get("POSTGRES_PASSWORD", "")
    database = os.environ.get("POSTGRES_DB", user)
    account = pwd.getpwnam("postgres")
    bin_dir = components.postgres_bin_dir()
    uid, gid = account.pw_uid, account.pw_gid
    data.mkdir(parents=True, exist_ok=True)
    os.chown(data, uid, gid)
    data.chmod(0o700)
    if not (data / "PG_VERSION").exists():
        with tempfile.NamedTemporaryFile("w", delete=False, dir="/tmp") as pwfile:
            pwfile.write(password or "postgres")
        os.chown(pwfile.name, uid, gid)
        subprocess.run(
            [str(bin_dir / "initdb"), "-D", str(data), "-U", user, f"--pwfile={pwfile.name}",
             "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8"],
            check=True, user=uid, group=gid,
        )  # fmt: skip
        os.unlink(pwfile.name)
        with open(data / "pg_hba.conf", "a") as hba:
            hba.write("host all all 0.0.0.0/0 scram-sha-256\nhost all all ::/0 scram-sha-256\n")
    server = subprocess.Popen(
        [str(bin_dir / "postgres"), "-D", str(data), "-c", "listen_addresses=*", "-k", "/tmp"],
        user=uid,
        group=gid,
    )
    signal.signal(signal.SIGTERM, lambda *_: server.send_signal(signal.SIGINT))
    signal.signal(signal.SIGINT, lambda *_: server.send_signal(signal.SIGINT))
    for _ in range(600):
        ready = subprocess.run([str(bin_dir / "pg_isready"), "-h", "/tmp"], capture_output=True)
        if ready.returncode == 0 or server.poll() is not None:
            break
        time.sleep(0.1)
    if server.poll() is None and database != "postgres":
        subprocess.run(
            [str(bin_dir / "createdb"), "-h", "/tmp", "-U", user, database],
            capture_output=True,
            user=uid,
            group=gid,
        )  # fails harmlessly when the database exists
    sys.exit(server.wait())


def link_postgres_tools() -> None:
    for name in ("pg_isready", "psql", "createdb"):
        if (components.postgres_bin_dir() / name).exists():
            _link(components.postgres_bin_dir() / name, name)


def link_redis_tools() -> None:
    server = components.redis_server_binary()
    _link(server, "redis-server")
    _link(server.parent / "redis-cli", "redis-cli")


COMMANDS = {
    "kafka": kafka,
    "postgres": postgres,
    "link-postgres-tools": link_postgres_tools,
    "link-redis-tools": link_redis_tools,
}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in COMMANDS:
        raise SystemExit(f"usage: python -m cellpilot.stack.container {'|'.join(COMMANDS)}")
    COMMANDS[sys.argv[1]]()
