"""The Kafka topics of Cellpilot: the one list the stack, compose and tests create.

Each topic is a stream of facts (docs/architecture.md, "The system map"); keys decide
partitioning so that every message about one job (or one machine) stays in order. A topic's
retention is how long its records are worth keeping: the raw samples only until the aggregator
has folded them into windows, windows and recommendations a while longer; the Borgmaster's
events and the actuations are kept (the broker's default). A broker that honours
``retention.ms`` (Kafka) enforces it; the embedded broker does not, and ``cellpilot run`` bounds
it by rotating those topics (:mod:`cellpilot.stack.broker_retention`).
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

    def configs(self) -> dict[str, str]:
        """The topic configs it is created with."""
        return {} if self.retention_ms is None else {"retention.ms": str(self.retention_ms)}


TOPICS: tuple[Topic, ...] = (
    Topic(
        "usage.samples",
        6,
        "machine id",
        "raw 1 s usage samples, batched per machine (Borglet -> aggregator)",
        retention_ms=10 * MINUTE_MS,
        committing_groups=("aggregator",),
    ),
    Topic(
        "usage.histograms",
        6,
        "job id",
        "5-minute per-job histograms (aggregator -> recommenders)",
        retention_ms=30 * MINUTE_MS,
        committing_groups=("recommender",),
    ),
    Topic(
        "recommendations",
        6,
        "job id",
        "every recommender's output (recommenders -> Autopilot master)",
        retention_ms=30 * MINUTE_MS,
    ),
    Topic("actuations", 3, "job id", "chosen limits and task counts (Autopilot master -> actuator)"),
    Topic("borg.events", 3, "job id", "task and machine events in checkpoint-log order (Borgmaster)"),
    Topic("deadletter", 1, "source topic", "malformed records skipped by consumers, with the reason"),
)


def partitions_of(topic: str) -> int:
    """The partition count :data:`TOPICS` declares for ``topic``."""
    return next(t.partitions for t in TOPICS if t.name == topic)
