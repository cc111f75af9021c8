"""Group commit: concurrent client writes share one fenced append to the checkpoint log.

Borg §3.1 keeps the cell state in a Paxos-based store; one round trip per request caps a
master at the store's transaction rate. Here client commands queue up; while one batch's
append is in flight the next batch collects, and one flusher task turns each batch into a
single :meth:`CheckpointLog.append` (one PostgreSQL transaction, fenced by the epoch):

* the commands of a batch are decided as if one after another
  (:class:`cellpilot.borg.batch_decisions.BatchDecider`): quota is carried through the
  batch, and a command that overlaps an earlier one (the same job, machine or request id)
  waits for the next batch (two requests with one request id: the second sees the first's
  record and is answered as a retry, or refused as a reuse);
* a refusal, a retry of an applied request or a no-op is answered at once and costs the
  others nothing; a command whose decision raises fails alone;
* the accepted commands' records are appended together and then applied; each command is
  answered only after that — a refused (fenced) or failed append answers every one of them
  with the error (:class:`NotLeader`, :class:`StoreUnavailable`): none is acknowledged.

``commit_batch_max = 1`` gives one transaction per request (the benchmark's baseline).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cellpilot.borg.batch_decisions import BatchDecider
from cellpilot.borg.decisions import Accepted, Command, Result
from cellpilot.borg.mutations import LogRecord

if TYPE_CHECKING:
    from cellpilot_services.borgmaster.replica import Replica

log = logging.getLogger(__name__)
Answer = tuple[Result, int]


@dataclass
class PendingWrite:
    command: Command
    cause_id: str
    answer: asyncio.Future[Answer]

    def reply(self, answer: Answer) -> None:
        if not self.answer.done():
            self.answer.set_result(answer)

    def fail(self, error: BaseException) -> None:
        if not self.answer.done():
            self.answer.set_exception(error)


class GroupCommit:
    """The master's write queue and its one flusher (see the module docstring)."""

    def __init__(self, replica: Replica, max_batch: int) -> None:
        self.replica = replica
        self.max_batch = max_batch
        self._queue: deque[PendingWrite] = deque()
        self._flusher: asyncio.Task[None] | None = None
        self.batches = 0  # appends made (for logs and the benchmark)
        self.committed = 0  # commands whose records those appends carried

    async def execute(self, command: Command, cause_id: str) -> Answer:
        """Queues ``command``; returns its result and log position once its records are committed."""
        write = PendingWrite(command, cause_id, asyncio.get_running_loop().create_future())
        self._queue.append(write)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_all())
        return await write.answer

    async def _flush_all(self) -> None:
        while self._queue:
            await self._flush_one()

    def _take(self, decider: BatchDecider) -> list[PendingWrite]:
        """The next batch: queued writes in order, skipping (for now) any that overlaps an
        earlier one, up to ``max_batch``. Writes whose callers gave up are dropped."""
        batch: list[PendingWrite] = []
        waiting: list[PendingWrite] = []
        while self._queue and len(batch) < self.max_batch:
            write = self._queue.popleft()
            if not write.answer.done():
                (batch if decider.admits(write.command) else waiting).append(write)
        self._queue.extendleft(reversed(waiting))
        return batch

    async def _flush_one(self) -> None:
        replica = self.replica
        async with replica.lock:
            if not replica.is_leader:
                error = replica.not_leader()
                while self._queue:
                    self._queue.popleft().fail(error)
                return
            decider = BatchDecider(replica.state, replica.event_now_ms(), replica.view)
            batch = self._take(decider)
            try:
                await self._decide_and_commit(decider, batch)
            except asyncio.CancelledError:
                for write in batch:
                    write.fail(replica.not_leader())
                raise
            except Exception as error:  # NotLeader / StoreUnavailable: the replica stepped down
                log.warning(
                    "batch not committed",
                    extra={"writes": len(batch), "error": f"{type(error).__name__}: {error}"},
                )
                for write in batch:
                    write.fail(error)

    async def _decide_and_commit(self, decider: BatchDecider, batch: list[PendingWrite]) -> None:
        replica = self.replica
        state = replica.state
        first = state.last_sequence + 1
        records: list[LogRecord] = []
        committing: list[tuple[PendingWrite, Accepted, int]] = []
        for write in batch:
            try:
                result = decider.decide(write.command)
            except Exception as error:
                log.exception("deciding a command failed", extra={"cause_id": write.cause_id})
                write.fail(error)
                continue
            if not isinstance(result, Accepted):
                write.reply((result, 0))
            elif result.already_applied is not None:
                write.reply((result, result.already_applied.sequence))
            elif not result.mutations:
                write.reply((result, state.last_sequence))
            else:
                seq = first + len(records)
                records += replica.log_records(seq, result.mutations, write.cause_id, write.command)
                committing.append((write, result, seq))
        if not records:
            return
        await replica.commit_records(records)
        self.batches += 1
        self.committed += len(committing)
        for write, result, seq in committing:
            write.reply((result, seq))
