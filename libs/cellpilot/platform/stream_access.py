"""How a process reaches the streams: the broker's address, how it logs in, what it signs with and
what it trusts — one :class:`StreamAccess`, built once per process, handed to every Kafka client.

* **Signing** (:mod:`cellpilot.security.record_signing`): a service's producers sign every
  record with its own record-signing key; its consumers check every record against the stack's
  CA and the producer table. Observers (the chaos run, tests, tools) verify and sign nothing.
* **Broker login** (:class:`BrokerLogin`): anonymous plaintext by default (the embedded broker);
  SASL (SCRAM) as the service's own broker user, over TLS or not, where the broker can
  authenticate (the registry path's Kafka in compose; docs/security.md). The user is the
  service's account and the password its ``<account>.password`` file, like the stores'
  (:mod:`cellpilot.security.store_secrets`); ``CELLPILOT_KAFKA_SECURITY_PROTOCOL`` and
  ``CELLPILOT_KAFKA_SASL_MECHANISM`` choose the protocol (:class:`PlatformSettings`).
* **Durability** (:class:`WriteDurability`): what a producer asks of the broker before a record
  counts as written, and how many copies a topic is created with — as much as the broker can
  give (``CELLPILOT_KAFKA_IDEMPOTENCE``, ``CELLPILOT_KAFKA_REPLICATION_FACTOR``).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from cellpilot.security.certificates import CA_CERT
from cellpilot.security.record_signing import RecordSigner, RecordVerifier
from cellpilot.security.store_secrets import read_store_password

SecurityProtocol = Literal["PLAINTEXT", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["SCRAM-SHA-256", "SCRAM-SHA-512"]


@dataclass(frozen=True)
class BrokerLogin:
    """How a Kafka client authenticates to the broker (aiokafka's security settings)."""

    protocol: SecurityProtocol = "PLAINTEXT"
    mechanism: SaslMechanism = "SCRAM-SHA-512"
    username: str = ""
    password: str = field(default="", repr=False)
    ca_file: str = ""  # SASL_SSL: the CA that signed the broker's certificate

    @classmethod
    def of_account(
        cls, protocol: SecurityProtocol, mechanism: SaslMechanism, account: str, certs_dir: Path
    ) -> BrokerLogin:
        """``account``'s login: nothing for PLAINTEXT; its password file for SASL; the stack's CA
        for TLS."""
        if protocol == "PLAINTEXT":
            return cls()
        password = read_store_password(certs_dir, account)
        ca_file = str(certs_dir / CA_CERT) if protocol == "SASL_SSL" else ""
        return cls(protocol, mechanism, account, password, ca_file)

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments for AIOKafkaProducer / AIOKafkaConsumer / AIOKafkaAdminClient."""
        if self.protocol == "PLAINTEXT":
            return {}
        options: dict[str, Any] = {
            "security_protocol": self.protocol,
            "sasl_mechanism": self.mechanism,
            "sasl_plain_username": self.username,
            "sasl_plain_password": self.password,
        }
        if self.protocol == "SASL_SSL":
            options["ssl_context"] = self.ssl_context
        return options

    @cached_property
    def ssl_context(self) -> ssl.SSLContext:
        """Verifies the broker's certificate (and host name) against the stack's CA; one per login."""
        context = ssl.create_default_context(cafile=self.ca_file or None)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        return context


@dataclass(frozen=True)
class WriteDurability:
    """What a write asks of the broker, the one place every producer's options come from.

    Every producer waits for ``acks=all``: the record is on every in-sync replica before the
    broker answers (one replica on a single broker; with ``min.insync.replicas`` 2 of a
    replication factor 3, at least two). ``idempotence``: the producer takes a producer id
    (InitProducerId) and numbers its batches, so a retried batch is written once, in order; a
    batch the broker failed with a retriable error is retried until it is taken (without
    idempotence aiokafka fails it once its request timeout has passed; with either, a batch
    whose partition has no leader fails after that timeout). It needs ``acks=all``
    (aiokafka refuses anything else) and at most 5 requests in flight per connection; aiokafka
    has no such setting and sends one produce request per broker at a time, which satisfies it.

    Kafka grants the id (compose's registry path). Tansu 0.6 (the embedded and offline brokers)
    does not: aiokafka 0.14 asks with InitProducerId version 0, which has no producer id and
    epoch fields, and Tansu only handles them present. Its in-memory engine answers
    UNKNOWN_SERVER_ERROR; its SQLite engine (the durable broker) panics in an unimplemented
    branch and then serves no client until it is restarted. So idempotence is off unless the
    broker is Kafka. ``replication_factor``: how many copies of each partition a topic is
    created with (1 on a single broker; 3 under docker-compose.kafka-ha.yml).
    """

    idempotence: bool = False
    replication_factor: int = 1

    def producer_options(self) -> dict[str, Any]:
        """Keyword arguments for AIOKafkaProducer: how sure a write is when it is acknowledged."""
        return {"acks": "all", "enable_idempotence": self.idempotence}


@dataclass(frozen=True)
class StreamAccess:
    """Everything a process's Kafka clients need: where, as whom, signing with what, trusting what.

    ``signer`` None: the process writes no stream (an observer). ``verifier`` None: records are
    applied unchecked — only a benchmark's baseline builds that, in code (no setting does).
    """

    bootstrap: str
    verifier: RecordVerifier | None
    signer: RecordSigner | None = None
    login: BrokerLogin = field(default_factory=BrokerLogin)
    durability: WriteDurability = field(default_factory=WriteDurability)

    def client_options(self) -> dict[str, Any]:
        return {"bootstrap_servers": self.bootstrap, **self.login.client_options()}

    @classmethod
    def service(
        cls,
        bootstrap: str,
        certs_dir: Path,
        identity: str,
        login: BrokerLogin | None = None,
        durability: WriteDurability | None = None,
    ) -> StreamAccess:
        """A service writing as ``identity`` (its signing key in ``certs_dir``) and checking what it reads."""
        return cls(
            bootstrap,
            RecordVerifier.load(certs_dir),
            RecordSigner.load(certs_dir, identity),
            login or BrokerLogin(),
            durability or WriteDurability(),
        )

    @classmethod
    def observer(cls, bootstrap: str, certs_dir: Path, login: BrokerLogin | None = None) -> StreamAccess:
        """A reader that checks every record and writes nothing (the chaos run, tests, tools)."""
        return cls(bootstrap, RecordVerifier.load(certs_dir), None, login or BrokerLogin())

    @classmethod
    def admin(
        cls, bootstrap: str, login: BrokerLogin, durability: WriteDurability | None = None
    ) -> StreamAccess:
        """Topic administration only (creating topics, with ``durability``'s replication factor):
        it neither reads nor writes records."""
        return cls(bootstrap, None, None, login, durability or WriteDurability())

    def at(self, bootstrap: str) -> StreamAccess:
        """The same access to another broker."""
        return replace(self, bootstrap=bootstrap)


Broker = str | StreamAccess


def client_options(broker: Broker) -> dict[str, Any]:
    """Connection options for a bootstrap address (anonymous) or a :class:`StreamAccess`."""
    return broker.client_options() if isinstance(broker, StreamAccess) else {"bootstrap_servers": broker}


def durability_of(broker: Broker) -> WriteDurability:
    """What writes and new topics ask of the broker (a bare address: a single Tansu's defaults)."""
    return broker.durability if isinstance(broker, StreamAccess) else WriteDurability()


def producer_options(broker: Broker) -> dict[str, Any]:
    """Every keyword argument of a producer to ``broker`` but its own (client id, batching):
    where, as whom, and how durable its writes are — the one place they are decided."""
    return {**client_options(broker), **durability_of(broker).producer_options()}


def bootstrap_of(broker: Broker) -> str:
    return broker.bootstrap if isinstance(broker, StreamAccess) else broker
