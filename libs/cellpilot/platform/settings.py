"""Connection and runtime settings every service shares (docs/architecture.md rule 3).

Values come from environment variables prefixed ``CELLPILOT_`` and, underneath them,
from the embedded stack's ``stack.env`` file (``CELLPILOT_STACK_ENV`` names it; the
default is ``.cellpilot/stack/stack.env``). A service builds its settings once, in its
entry point, and passes them down.

A service's own settings class inherits one of the bases here and sets its environment
prefix (``CELLPILOT_<SERVICE>_``):

* :class:`ServiceSettings`: the platform, the service's security, its replica index;
* :class:`ReplicaServerSettings`: also the gRPC address of replica ``i`` (``base_port + i``);
* :class:`MeteredReplicaSettings`: also the Prometheus ``/metrics`` port (the gRPC port + 1000).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Self

from pydantic import AliasChoices, BeforeValidator, Field, ValidationError
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from cellpilot.platform.metrics import DEFAULT_METRICS_PORT_OFFSET
from cellpilot.platform.stack_env import DEFAULT_STACK_ENV, stack_env_file
from cellpilot.security.tls import SecuritySettings

if TYPE_CHECKING:
    from cellpilot.platform.stream_access import BrokerLogin, StreamAccess, WriteDurability

__all__ = [
    "DEFAULT_STACK_ENV",
    "AddressList",
    "MeteredReplicaSettings",
    "PlatformSettings",
    "ReplicaServerSettings",
    "ServiceSettings",
    "comma_separated",
]

# The Borgmaster replicas of `cellpilot run`, which every client of the Borgmaster defaults to.
BORGMASTER_ADDRESSES = ("127.0.0.1:7100", "127.0.0.1:7101", "127.0.0.1:7102")


def comma_separated(value: object) -> object:
    """A list from ``a, b,c`` (the environment's form); a list passes through."""
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


# A list of host:port addresses, comma-separated in the environment.
AddressList = Annotated[list[str], NoDecode, BeforeValidator(comma_separated)]


class PlatformSettings(BaseSettings):
    """Where the shared infrastructure is, and how a service reports about itself."""

    model_config = SettingsConfigDict(env_prefix="CELLPILOT_", extra="ignore")

    kafka_bootstrap: str = "127.0.0.1:9092"
    # How Kafka clients log in: PLAINTEXT (anonymous: the embedded broker), or SASL as the
    # service's own broker user (its account, its <account>.password) — over TLS (SASL_SSL,
    # the stack's CA: the registry path's Kafka in compose) or not (SASL_PLAINTEXT).
    kafka_security_protocol: Literal["PLAINTEXT", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    kafka_sasl_mechanism: Literal["SCRAM-SHA-256", "SCRAM-SHA-512"] = "SCRAM-SHA-512"
    # What a write asks of the broker (cellpilot.platform.stream_access.WriteDurability): every
    # producer waits for acks=all; idempotent producers only where the broker grants producer
    # ids (Kafka: compose's registry path; never Tansu 0.6, which refuses aiokafka's request).
    # Topics are created with this many replicas (3 under docker-compose.kafka-ha.yml).
    kafka_idempotence: bool = False
    kafka_replication_factor: int = Field(default=1, ge=1)
    # Store URLs without a user: each service connects as its own account (postgres_url_for,
    # redis_url_for). A URL that names a user is used as given (an operator's explicit credential).
    postgres_url: str = "postgresql+asyncpg://127.0.0.1:5432/cellpilot"
    redis_url: str = "redis://127.0.0.1:6379/0"
    # Where `cellpilot certs issue` wrote the certificates and each account's store password
    # (<account>.password, mode 0600): the same CELLPILOT_CERTS_DIR as SecuritySettings.
    certs_dir: Path = Path(".cellpilot/certs")
    # OTLP/gRPC collector endpoint (e.g. http://127.0.0.1:4317); unset means no export.
    otlp_endpoint: str | None = None
    log_level: str = "INFO"
    # How often (wall seconds) every Kafka consumer checks its stored positions against the
    # broker's partition logs, records or not (cellpilot.platform.kafka.LogPositions).
    log_check_interval_s: float = Field(default=5.0, gt=0)
    # JSON log lines (for machines) or plain text (for people at a terminal).
    log_json: bool = True

    def postgres_url_for(self, account: str) -> str:
        """The PostgreSQL URL as ``account``'s role (cellpilot.platform.store_accounts)."""
        from cellpilot.platform.store_accounts import service_postgres_url

        return service_postgres_url(self.postgres_url, account, self.certs_dir)

    def broker_login(self, account: str) -> BrokerLogin:
        """How ``account``'s Kafka clients log in to the broker (cellpilot.platform.stream_access)."""
        from cellpilot.platform.stream_access import BrokerLogin

        return BrokerLogin.of_account(
            self.kafka_security_protocol, self.kafka_sasl_mechanism, account, self.certs_dir
        )

    def write_durability(self) -> WriteDurability:
        """What every producer and every topic creation asks of the broker."""
        from cellpilot.platform.stream_access import WriteDurability

        return WriteDurability(self.kafka_idempotence, self.kafka_replication_factor)

    def redis_url_for(self, account: str) -> str:
        """The Redis URL as ``account``'s ACL user (cellpilot.platform.store_accounts)."""
        from cellpilot.platform.store_accounts import service_redis_url

        return service_redis_url(self.redis_url, account, self.certs_dir)

    @classmethod
    def load(cls, env_file: Path | None = None) -> PlatformSettings:
        """Environment first, then the stack's env file (if it exists), then defaults."""
        path = stack_env_file(env_file)
        return cls() if path is None else cls(_env_file=path)  # type: ignore[call-arg]


class ServiceSettings(BaseSettings):
    """What every service's one settings class holds: the platform, the service's security,
    and which replica of the service this process is.

    ``replica_index`` is read from ``<prefix>REPLICA_INDEX``, else from
    ``CELLPILOT_REPLICA_INDEX`` (what ``cellpilot run`` sets for each replica it starts).
    """

    model_config = SettingsConfigDict(env_prefix="CELLPILOT_", extra="ignore")
    # The service's name: its account, its log and telemetry name, its replica ids.
    service_name: ClassVar[str] = ""

    platform: PlatformSettings = Field(default_factory=PlatformSettings)
    # mTLS certificates, token secret, request size limit (CELLPILOT_TLS_MODE, CELLPILOT_CERTS_DIR).
    security: SecuritySettings = Field(default_factory=SecuritySettings.load)
    replica_index: int = Field(default=0, ge=0)

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        prefix = cls.model_config.get("env_prefix", "")
        cls.model_fields["replica_index"].validation_alias = AliasChoices(
            f"{prefix}REPLICA_INDEX", "CELLPILOT_REPLICA_INDEX"
        )
        cls.model_rebuild(force=True)

    @classmethod
    def load(cls) -> Self:
        return cls(platform=PlatformSettings.load())

    @classmethod
    def load_or_exit(cls) -> Self:
        """:meth:`load`, or exit with one line naming each bad setting (no traceback)."""
        try:
            return cls.load()
        except ValidationError as error:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
            raise SystemExit(f"invalid {cls.service_name.capitalize()} settings: {problems}") from None

    def metrics_port_to_serve(self) -> int | None:
        """Where the service serves Prometheus ``/metrics`` on its own; None: it does not."""
        return None

    def stream_identity(self) -> str:
        """The identity whose record-signing key signs what this service writes."""
        return self.service_name

    def stream_access(self) -> StreamAccess:
        """How this service uses the streams: it signs as :meth:`stream_identity`, checks what it
        reads against the stack's CA, and logs in to the broker as its own account."""
        from cellpilot.platform.stream_access import StreamAccess

        return StreamAccess.service(
            self.platform.kafka_bootstrap,
            self.security.certs_dir,
            self.stream_identity(),
            self.platform.broker_login(self.service_name),
            self.platform.write_durability(),
        )


class ReplicaServerSettings(ServiceSettings):
    """A replicated gRPC server: replica ``i`` listens on ``base_port + i`` unless ``port`` is
    set, and is called ``<service>-<i>`` unless ``replica_id`` is set. A service sets its own
    ``base_port`` default."""

    replica_id: str = ""  # default "<service_name>-<replica_index>"
    listen_host: str = "127.0.0.1"
    base_port: int = Field(default=7000, ge=1, le=65_000)
    port: int = Field(default=-1, ge=-1, le=65_535)  # -1: base_port + replica_index; 0: any free port

    @property
    def resolved_replica_id(self) -> str:
        return self.replica_id or f"{self.service_name}-{self.replica_index}"

    @property
    def resolved_port(self) -> int:
        return self.base_port + self.replica_index if self.port < 0 else self.port


class MeteredReplicaSettings(ReplicaServerSettings):
    """A replicated gRPC server that also serves Prometheus ``/metrics`` on a port of its own."""

    # Prometheus /metrics: -1 = the gRPC port + 1000, 0 = any free port.
    metrics_port: int = Field(default=-1, ge=-1, le=65_535)

    @property
    def resolved_metrics_port(self) -> int:
        if self.metrics_port >= 0:
            return self.metrics_port
        return self.resolved_port + DEFAULT_METRICS_PORT_OFFSET if self.resolved_port else 0

    def metrics_port_to_serve(self) -> int | None:
        return self.resolved_metrics_port
