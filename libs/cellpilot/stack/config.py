"""Where an embedded stack lives (data directory, ports) and how clients reach it."""

from __future__ import annotations

import hashlib
import json
import socket
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from urllib.parse import quote

# sockaddr_un holds 107 characters; PostgreSQL adds "/.s.PGSQL.<port>" (up to 15) to the directory.
MAX_SOCKET_DIR_CHARS = 90

DEFAULT_DATA_DIR = Path(".cellpilot/stack")
STATE_FILE = "stack.json"
ENV_FILE = "stack.env"
CERTS_DIR = "certs"


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel says is free now (bound then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


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
        if self.state_path.exists():
            remembered = json.loads(self.state_path.read_text()).get("ports", {})

        def pick(name: str) -> int:
            return int(getattr(self, name) or remembered.get(name) or free_port(self.host))

        return replace(
            self,
            data_dir=self.data_dir.resolve(),
            kafka_port=pick("kafka_port"),
            postgres_port=pick("postgres_port"),
            redis_port=pick("redis_port"),
        )

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

    def as_env(self) -> dict[str, str]:
        env = {
            "CELLPILOT_KAFKA_BOOTSTRAP": self.kafka_bootstrap,
            "CELLPILOT_POSTGRES_URL": self.postgres_url,
            "CELLPILOT_REDIS_URL": self.redis_url,
        }
        if self.certs_dir:
            env["CELLPILOT_CERTS_DIR"] = self.certs_dir
        return env

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
        )

    def as_dict(self) -> dict[str, str]:
        return asdict(self)
