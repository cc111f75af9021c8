"""A replica's share of a consumer group's partitions, each owned under a fencing epoch.

The replicas of a stateful consumer (the aggregator, the recommender workers) share one
topic's partitions through a consumer group, and keep each partition's state in a store. A
replica assigned a partition *claims* it: the store bumps the partition's epoch (its fencing
token) and returns the checkpoint to resume from, with the :class:`AppliedOffsets` that skip
the records the checkpoint already holds. Every save is conditional on the epoch; a refused
save means another replica has taken the partition over, and it is dropped here
(docs/architecture.md rule 7). After a save the consumed offset is committed, a hint only: the
checkpoint is what counts. The positions are checked against the broker's logs at every claim
and periodically, records or not, so a broker that lost its log is noticed without waiting
for traffic (rule 13).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from cellpilot.platform.kafka import AppliedOffsets, Record
from cellpilot.platform.kafka_consumers import MessageConsumer

log = logging.getLogger(__name__)

STEP_RETRY_S = 0.5  # after a failed step, before the next batch


@dataclass
class OwnedPartition:
    """A claimed partition: its epoch (the fencing token of every save) and the positions its
    state holds. ``dirty``: records applied since the last save."""

    partition: int
    epoch: int
    fence: AppliedOffsets
    dirty: bool = False


@dataclass(frozen=True)
class AssignmentChange:
    """What one look at the group's assignment changed."""

    revoked: list[int] = field(default_factory=list)
    claimed: list[int] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.revoked or self.claimed)


P = TypeVar("P", bound=OwnedPartition)


class PartitionOwner(Generic[P]):
    """Follows ``consumer``'s assignment of ``topic``: claims what it is given (``claim``
    restores a partition's state under a new epoch), forgets what is taken away, drops what
    another replica's epoch took over, and commits the offsets of what it saved."""

    def __init__(
        self, consumer: MessageConsumer, topic: str, replica_id: str, claim: Callable[[int], Awaitable[P]]
    ) -> None:
        self.consumer = consumer
        self.topic = topic
        self.replica_id = replica_id
        self._claim = claim
        self.owned: dict[int, P] = {}

    def fences(self) -> list[AppliedOffsets]:
        return [owned.fence for owned in self.owned.values()]

    async def follow_assignment(self) -> AssignmentChange:
        """Forget the partitions no longer assigned; claim the newly assigned ones."""
        assigned = {tp.partition for tp in self.consumer.assignment() if tp.topic == self.topic}
        revoked = sorted(set(self.owned) - assigned)
        for partition in revoked:
            log.info("partition revoked", extra={"partition": partition, "replica": self.replica_id})
            del self.owned[partition]
        claimed = sorted(assigned - set(self.owned))
        for partition in claimed:
            owned = await self._claim(partition)
            self.owned[partition] = owned
            log.info(
                "partition claimed",
                extra={
                    "partition": partition,
                    "epoch": owned.epoch,
                    "next_offset": owned.fence.next_offset.get((self.topic, partition), 0),
                    "replica": self.replica_id,
                },
            )
        return AssignmentChange(revoked, claimed)

    async def run(
        self,
        step: Callable[[list[Record], AssignmentChange], Awaitable[None]],
        stop: asyncio.Event,
        timeout_ms: int,
        max_records: int,
    ) -> None:
        """Until ``stop``: for each batch (possibly empty), follow the assignment, drop the records
        of a log that was reset (checked at a claim, else when due), then ``step``. A failed step
        is logged and the loop goes on with the next batch."""
        async for records in self.consumer.batches(timeout_ms=timeout_ms, max_records=max_records):
            if stop.is_set():
                return
            try:
                change = await self.follow_assignment()
                if change.claimed:  # the replay guard starts from what each claim applied last
                    claimed = [self.owned[p].fence for p in change.claimed if p in self.owned]
                    records = self.consumer.resume_claimed(records, claimed)
                records = await self.consumer.follow_log_resets(
                    records, self.fences(), force=bool(change.claimed)
                )
                await step(records, change)
            except Exception:
                log.exception("partition step failed; continuing", extra={"replica": self.replica_id})
                await asyncio.sleep(STEP_RETRY_S)

    def keep(self, owned: P, saved: bool) -> bool:
        """After a fenced save of ``owned``: True if it was saved; otherwise another replica's
        epoch owns the partition now, and it is dropped here."""
        if saved:
            return True
        log.warning(
            "partition taken over by another replica; dropping it",
            extra={"partition": owned.partition, "epoch": owned.epoch, "replica": self.replica_id},
        )
        self.owned.pop(owned.partition, None)
        return False

    async def commit(self, owned: P) -> None:
        """Commit the group's offset up to what ``owned``'s saved state holds."""
        next_offset = owned.fence.next_offset.get((self.topic, owned.partition), 0)
        if next_offset <= 0:
            return
        marker = Record(self.topic, owned.partition, next_offset - 1, "", b"", (), 0)
        try:
            await self.consumer.commit([marker])
        except Exception as error:  # rebalancing: the checkpoint is what counts
            log.info("offset commit skipped", extra={"partition": owned.partition, "error": str(error)})
