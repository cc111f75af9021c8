"""Partitions of a consumer group that no live member consumes, noticed by the other members.

A group member that is cut off the network (or hangs) keeps heartbeating no more; the broker's
group coordinator drops it after the session timeout and should hand its partitions to the
others at the next rebalance. The durable Tansu 0.6 (SQLite engine) drops the member but starts
no new generation: the others rejoin with their old assignments, and the cut-off member's
partitions are consumed by no one until it comes back (the in-memory engine rebalances). So the
members watch what they do not own: a partition whose group offset has not moved for
``after_s`` while records wait beyond it is abandoned, and a member that sees one leaves the
group and joins again as a new member, which makes the coordinator form a new generation and
assign every partition among the live members. A slow but live owner costs at most a rebalance:
the services' partition claims are fenced (a claim bumps the partition's epoch).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

Partition = tuple[str, int]  # (topic, partition)

ABANDONED_AFTER_S = 60.0  # six session timeouts (MessageConsumer's 10 s)
CHECK_EVERY_S = 10.0


@dataclass
class AbandonedPartitions:
    """What one member has seen of the partitions it does not own: each one's group offset and
    since when it has not moved while records waited (monotonic seconds)."""

    after_s: float = ABANDONED_AFTER_S
    stalled: dict[Partition, tuple[int, float]] = field(default_factory=dict)

    def observe(
        self,
        now: float,
        owned: set[Partition],
        committed: Mapping[Partition, int | None],
        log_end: Mapping[Partition, int],
    ) -> list[Partition]:
        """Takes one look at the partitions of ``log_end`` this member does not own; returns
        those abandoned for ``after_s`` (records beyond the group offset, which has not moved).
        A partition never committed counts from offset 0."""
        abandoned = []
        for partition, end in log_end.items():
            offset = committed.get(partition) or 0
            if partition in owned or offset >= end:
                self.stalled.pop(partition, None)
                continue
            seen = self.stalled.get(partition)
            if seen is None or seen[0] != offset:
                self.stalled[partition] = (offset, now)
            elif now - seen[1] >= self.after_s:
                abandoned.append(partition)
        return abandoned

    def forget(self) -> None:
        """After a rejoin: everything is looked at afresh."""
        self.stalled.clear()
