"""The Kafka topics of Cellpilot: the one list the stack, compose and tests create.

Each topic is a stream of facts (docs/architecture.md, "The system map"); keys decide
partitioning so that every message about one job (or one machine) stays in order. A topic's
retention is how long its records are worth keeping: the raw samples only until the aggregator
has folded them into windows, windows and recommendations a while longer; the Borgmaster's
events and the actuations are kept (the broker's default). A topic with a retention is created
with ``cleanup.policy=delete`` and its ``retention.ms``: Kafka enforces them, and so does the
durable embedded broker (Tansu's SQLite engine deletes, at each maintenance pass, the records
older than ``retention.ms`` of the topics whose ``cleanup.policy`` says ``delete``, and keeps
every other topic's). The in-memory broker honours neither, and ``cellpilot run`` bounds it by
rotating those topics (:mod:`cellpilot.stack.broker_retention`).

Each topic also says who may write it and who reads it: the **producer table**. Every record
carries its producer's signature (:mod:`cellpilot.security.record_signing`); a reader applies a
record only if the signer's service kind is among the topic's ``writers`` (and, for a topic
keyed by machine id, only if the signer's certificate names that machine). A broker with
access control (the registry path's Kafka) gets ACLs from the same table
(:mod:`cellpilot.stack.kafka_access`): ``writers`` may write, ``readers`` may read.
"""

from __future__ import annotations

from dataclasses import dataclass

MINUTE_MS = 60_000


@dataclass(frozen=True)
class Topic:
    name: str
    partitions: int
    key: str  # what the message key is, so ordering guarantees are explicit
    purpose: str
    retention_ms: int | None = None  # None: the broker's default
    # The consumer groups that commit their positions on the topic (the services' default
    # group names); a rotation of the embedded broker waits for them and counts what they lose.
    committing_groups: tuple[str, ...] = ()
    # The producer table: the service kinds whose records on this topic are applied, and the
    # service kinds that read it (the broker's ACLs; the signatures do not depend on them).
    writers: tuple[str, ...] = ()
    readers: tuple[str, ...] = ()
    # The key is a machine id: a writer may write only for the machines its certificate names.
    keyed_by_machine: bool = False

    def configs(self) -> dict[str, str]:
        """The topic configs it is created with."""
        if self.retention_ms is None:
            return {}
        return {"cleanup.policy": "delete", "retention.ms": str(self.retention_ms)}


# Every service kind of a stack (the first part of a service identity: ``borglet-r0`` -> ``borglet``).
SERVICE_KINDS = ("borgmaster", "borglet", "aggregator", "recommender", "autopilot", "actuator", "dashboard")

TOPICS: tuple[Topic, ...] = (
    Topic(
        "usage.samples",
        6,
        "machine id",
        "raw 1 s usage samples, batched per machine (Borglet -> aggregator)",
        retention_ms=10 * MINUTE_MS,
        committing_groups=("aggregator",),
        writers=("borglet",),
        readers=("aggregator",),
        keyed_by_machine=True,
    ),
    Topic(
        "usage.histograms",
        6,
        "job id",
        "5-minute per-job histograms (aggregator -> recommenders)",
        retention_ms=30 * MINUTE_MS,
        committing_groups=("recommender",),
        writers=("aggregator",),
        readers=("recommender",),
    ),
    Topic(
        "recommendations",
        6,
        "job id",
        "every recommender's output (recommender workers, and custom recommenders through the"
        " Autopilot master's API -> Autopilot master)",
        retention_ms=30 * MINUTE_MS,
        writers=("recommender", "autopilot"),
        readers=("autopilot", "dashboard"),
    ),
    Topic(
        "actuations",
        3,
        "job id",
        "chosen limits and task counts (Autopilot master -> actuator)",
        writers=("autopilot",),
        readers=("actuator",),
    ),
    Topic(
        "borg.events",
        3,
        "job id",
        "task and machine events in checkpoint-log order (Borgmaster)",
        writers=("borgmaster",),
        # The Borgmaster reads back what it published (its positions are checked against the log).
        readers=("borgmaster", "recommender", "dashboard"),
    ),
    Topic(
        "deadletter",
        1,
        "source topic",
        "records a consumer refused or could not decode, with the reason (nothing applies them)",
        writers=SERVICE_KINDS,
    ),
)


def partitions_of(topic: str) -> int:
    """The partition count :data:`TOPICS` declares for ``topic``."""
    return next(t.partitions for t in TOPICS if t.name == topic)


def stream_of(name: str) -> Topic | None:
    """The declared topic whose stream ``name`` carries: the topic of that name, or of the name
    before a suffix (``actuations.cell-b``, ``usage.samples.3f2a``: a copy of the stream under
    another name, e.g. one per test or per cell). None: not a Cellpilot stream."""
    for topic in TOPICS:
        if name == topic.name or name.startswith(topic.name + "."):
            return topic
    return None
