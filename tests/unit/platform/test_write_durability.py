"""How sure a write is when the broker acknowledges it, decided in one place for every producer.

Every producer waits for ``acks=all``; an idempotent producer (a retried batch written once)
where the broker grants producer ids — Kafka, switched on by ``CELLPILOT_KAFKA_IDEMPOTENCE`` on
compose's registry path — and not on Tansu (the default: the embedded and offline brokers refuse
aiokafka's InitProducerId, tests/integration/platform/test_durable_writes.py). Topics are created
with ``CELLPILOT_KAFKA_REPLICATION_FACTOR`` replicas. The producers of the records that must not
be lost (actuations, Borg events, recommendations) are the services' MessageProducers, and no
code builds a producer without these options.
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from cellpilot.platform import kafka
from cellpilot.platform.kafka import MessageProducer, ensure_topics
from cellpilot.platform.settings import PlatformSettings, ServiceSettings
from cellpilot.platform.stream_access import StreamAccess, WriteDurability, producer_options
from cellpilot.platform.topics import TOPICS, Topic
from cellpilot.security.certificates import IdentityRequest, issue_all

REPO = Path(__file__).resolve().parents[3]
MUST_NOT_LOSE = ("actuations", "borg.events", "recommendations")
WRITERS = {t.name: t.writers for t in TOPICS}


@pytest.fixture
def certs(tmp_path: Path) -> Path:
    kinds = sorted({kind for name in MUST_NOT_LOSE for kind in WRITERS[name]})
    issue_all(tmp_path, [IdentityRequest(kind) for kind in kinds], valid_days=2)
    return tmp_path


def test_by_default_every_write_waits_for_all_replicas_without_idempotence() -> None:
    settings = PlatformSettings(_env_file=None)  # type: ignore[call-arg]
    assert settings.write_durability() == WriteDurability(idempotence=False, replication_factor=1)
    assert producer_options("127.0.0.1:9092") == {
        "bootstrap_servers": "127.0.0.1:9092",
        "acks": "all",
        "enable_idempotence": False,
    }


def test_the_environment_turns_on_idempotence_and_three_replicas(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CELLPILOT_KAFKA_IDEMPOTENCE", "true")
    monkeypatch.setenv("CELLPILOT_KAFKA_REPLICATION_FACTOR", "3")
    settings = PlatformSettings(_env_file=None)  # type: ignore[call-arg]
    assert settings.write_durability() == WriteDurability(idempotence=True, replication_factor=3)


def test_a_replication_factor_below_one_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CELLPILOT_KAFKA_REPLICATION_FACTOR", "0")
    with pytest.raises(ValueError, match="kafka_replication_factor"):
        PlatformSettings(_env_file=None)  # type: ignore[call-arg]


@pytest.mark.parametrize("topic", MUST_NOT_LOSE)
@pytest.mark.parametrize("idempotence", [True, False])
async def test_every_writer_of_a_topic_that_must_not_be_lost_acks_all_and_is_idempotent_where_allowed(
    topic: str, idempotence: bool, certs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CELLPILOT_KAFKA_IDEMPOTENCE", str(idempotence).lower())
    monkeypatch.setenv("CELLPILOT_CERTS_DIR", str(certs))
    for kind in WRITERS[topic]:

        class WriterSettings(ServiceSettings):
            service_name = kind

        settings = WriterSettings(platform=PlatformSettings(_env_file=None))  # type: ignore[call-arg]
        producer = MessageProducer(settings.stream_access(), client_id=f"{kind}-0")
        assert producer.options["acks"] == "all", kind
        assert producer.options["enable_idempotence"] is idempotence, kind
        # ...and aiokafka took them: it waits for every in-sync replica (acks -1) and, idempotent,
        # asks the broker for a producer id before its first batch.
        assert producer._producer._sender._acks == -1
        assert (producer._producer._txn_manager is not None) is idempotence


def _producer_constructions(path: Path) -> list[ast.Call]:
    tree = ast.parse(path.read_text())
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name | ast.Attribute)
        and (node.func.id if isinstance(node.func, ast.Name) else node.func.attr) == "AIOKafkaProducer"
    ]


def _takes_the_shared_options(call: ast.Call) -> bool:
    """``AIOKafkaProducer(**producer_options(...), ...)`` or ``AIOKafkaProducer(**self.options)``
    (MessageProducer's, built from producer_options): no acks or idempotence of its own."""
    spread = [k.value for k in call.keywords if k.arg is None]
    own = {k.arg for k in call.keywords if k.arg is not None}
    shared = any(
        (isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "producer_options")
        or (isinstance(v, ast.Attribute) and v.attr == "options")
        for v in spread
    )
    return shared and not own & {"acks", "enable_idempotence"}


def test_no_code_builds_a_producer_without_the_shared_options() -> None:
    sources = [*(REPO / "libs" / "cellpilot").rglob("*.py"), *(REPO / "services").rglob("*.py")]
    builders = {
        str(path.relative_to(REPO)): _producer_constructions(path)
        for path in sources
        if "AIOKafkaProducer" in path.read_text()
    }
    builders = {path: calls for path, calls in builders.items() if calls}
    assert "libs/cellpilot/platform/kafka.py" in builders  # MessageProducer
    for path, calls in builders.items():
        for call in calls:
            assert _takes_the_shared_options(call), f"{path}:{call.lineno} builds its own producer options"


class _RecordingAdmin:
    created: ClassVar[list[Any]] = []

    def __init__(self, **options: Any) -> None:
        pass

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def list_topics(self) -> list[str]:
        return []

    async def create_topics(self, topics: list[Any]) -> SimpleNamespace:
        self.created.extend(topics)
        return SimpleNamespace(topic_errors=[(t.name, 0, None) for t in topics])


class _TooFewBrokers(_RecordingAdmin):
    """A cluster with one broker registered of three, asked for three replicas."""

    async def create_topics(self, topics: list[Any]) -> SimpleNamespace:
        codes = {1: (0, None)}.get(topics[0].replication_factor, (38, "Replication factor: 3 larger than 1"))
        return SimpleNamespace(topic_errors=[(t.name, *codes) for t in topics])


@pytest.mark.parametrize("replicas", [1, 3])
async def test_topics_are_created_with_the_configured_replication_factor(
    replicas: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kafka, "AIOKafkaAdminClient", _RecordingAdmin)
    monkeypatch.setattr(_RecordingAdmin, "created", [])
    from cellpilot.platform.stream_access import BrokerLogin

    admin = StreamAccess.admin("kafka:9092", BrokerLogin(), WriteDurability(True, replicas))
    topics = [Topic("actuations", 3, "job id", "test"), Topic("borg.events", 3, "job id", "test")]
    assert await ensure_topics(admin, topics) == ["actuations", "borg.events"]
    assert [(t.name, t.num_partitions, t.replication_factor) for t in _RecordingAdmin.created] == [
        ("actuations", 3, replicas),
        ("borg.events", 3, replicas),
    ]


async def test_a_bare_bootstrap_address_creates_single_replica_topics(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kafka, "AIOKafkaAdminClient", _RecordingAdmin)
    monkeypatch.setattr(_RecordingAdmin, "created", [])
    await ensure_topics("127.0.0.1:9092", [Topic("actuations", 3, "job id", "test")])
    assert [t.replication_factor for t in _RecordingAdmin.created] == [1]


def test_the_same_access_elsewhere_keeps_its_durability() -> None:
    from cellpilot.platform.stream_access import BrokerLogin

    access = StreamAccess.admin("a:9092", BrokerLogin(), WriteDurability(True, 3))
    assert access.at("b:9092").durability == WriteDurability(True, 3)


async def test_a_topic_the_brokers_could_not_create_is_an_error_not_a_creation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """aiokafka returns CreateTopics' per-topic errors; the topics job must see them to retry."""
    from aiokafka.errors import InvalidReplicationFactorError

    from cellpilot.platform.stream_access import BrokerLogin

    monkeypatch.setattr(kafka, "AIOKafkaAdminClient", _TooFewBrokers)
    admin = StreamAccess.admin("kafka:9092", BrokerLogin(), WriteDurability(True, 3))
    with pytest.raises(InvalidReplicationFactorError, match="larger than 1"):
        await ensure_topics(admin, [Topic("actuations", 3, "job id", "test")])
