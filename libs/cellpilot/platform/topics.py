"""The Kafka topics of Cellpilot: the one list the stack, compose and tests create.

Each topic is a stream of facts (DESIGN.md, "The shape"); keys decide partitioning
so that every message about one job (or one machine) stays in order.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Topic:
    name: str
    partitions: int
    key: str  # what the message key is, so ordering guarantees are explicit
    purpose: str


TOPICS: tuple[Topic, ...] = (
    Topic(
        "usage.samples", 6, "machine id", "raw 1 s usage samples, batched per machine (Borglet -> aggregator)"
    ),
    Topic("usage.histograms", 6, "job id", "5-minute per-job histograms (aggregator -> recommenders)"),
    Topic("recommendations", 6, "job id", "every recommender's output (recommenders -> Autopilot master)"),
    Topic("actuations", 3, "job id", "chosen limits and task counts (Autopilot master -> actuator)"),
    Topic("borg.events", 3, "job id", "task and machine events in checkpoint-log order (Borgmaster)"),
    Topic("deadletter", 1, "source topic", "malformed records skipped by consumers, with the reason"),
)


def topic_names() -> list[str]:
    return [t.name for t in TOPICS]
