"""Group commit: every stimulus of the master shares fenced appends to the checkpoint log.

Borg §3.1 keeps the cell state in a Paxos-based store; one round trip per request caps a master
at the store's transaction rate. Here every stimulus — client commands, Borglet reports, a
scheduler's proposals, the election, timers — queues up; while one batch's append is in flight
the next batch collects, and one flusher turns each batch into a single fenced append:

* the core decides the stimuli of a batch as if one after another
  (:class:`cellpilot.borg.master_core.MasterBatch`): client commands share batches (quota
  carried through; one that overlaps an earlier one waits for the next batch); any other
  stimulus is a batch of its own;
* after a batch of its own (a report, a proposal, a timer), the client commands queued behind
  other such stimuli go first: a write waits for at most one of them, not for every report
  and proposal queued before it (nothing jumps ahead of an election, which opens a term);
* a refusal, a retry of an applied request or a no-op costs the others nothing; a stimulus
  whose decision raises fails alone;
* the batch's records are appended together, then applied, then each stimulus is answered —
  a refused (fenced) or failed append answers every one of them with the error
  (:class:`NotLeader`, :class:`StoreUnavailable`): none is acknowledged.

``commit_batch_max = 1`` gives one transaction per request (the benchmark's baseline).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cellpilot.borg.decisions import ClientCommand
from cellpilot.borg.master_core import Elected, Outcome, Stimulus

if TYPE_CHECKING:
    from cellpilot_services.borgmaster.replica import Replica

log = logging.getLogger(__name__)
Answer = tuple[Any, int]


@dataclass
class PendingStimulus:
    stimulus: Stimulus
    cause_id: str
    answer: asyncio.Future[Answer]

    def reply(self, answer: Answer) -> None:
        if not self.answer.done():
            self.answer.set_result(answer)

    def fail(self, error: BaseException) -> None:
        if not self.answer.done():
            self.answer.set_exception(error)


@dataclass
class CommitStats:
    batches: int = 0  # appends made
    committed: int = 0  # stimuli whose records those appends carried
    records: int = 0
    last_append_s: float = 0.0  # the latest append's round trip
    append_s_total: float = 0.0


class GroupCommit:
    """The master's one queue and its one flusher (see the module docstring)."""

    def __init__(self, replica: Replica, max_batch: int) -> None:
        self.replica = replica
        self.max_batch = max_batch
        self._queue: deque[PendingStimulus] = deque()
        self._flusher: asyncio.Task[None] | None = None
        self._last_alone = False  # the last batch was a stimulus of its own
        self.stats = CommitStats()

    @property
    def queued(self) -> int:
        return len(self._queue)

    async def submit(self, stimulus: Stimulus, cause_id: str = "") -> Answer:
        """Queues ``stimulus``; returns its answer and log position once its records are committed."""
        replica = self.replica
        if not replica.is_leader:
            raise replica.not_leader()
        pending = PendingStimulus(stimulus, cause_id, asyncio.get_running_loop().create_future())
        self._queue.append(pending)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_all())
        return await pending.answer

    def refuse_queued(self, error: BaseException) -> None:
        """The master stepped down: nothing queued will be decided here."""
        while self._queue:
            self._queue.popleft().fail(error)

    async def _flush_all(self) -> None:
        while self._queue:
            await self._flush_one()

    async def _flush_one(self) -> None:
        replica = self.replica
        async with replica._changing:
            if not replica.is_leader:
                self.refuse_queued(replica.not_leader())
                return
            batch = replica.core.batch(int(time.time() * 1000))
            taken: list[PendingStimulus] = []
            waiting: list[PendingStimulus] = []
            commands_first = self._last_alone and self._commands_queued()
            while self._queue and len(taken) < self.max_batch:
                pending = self._queue.popleft()
                if pending.answer.done():  # the caller gave up
                    continue
                if commands_first and isinstance(pending.stimulus, Elected):
                    self._queue.appendleft(pending)  # nothing goes ahead of a new term
                    break
                if commands_first and not isinstance(pending.stimulus, ClientCommand):
                    waiting.append(pending)  # keeps its place for the next batch
                    continue
                (taken if batch.admits(pending.stimulus) else waiting).append(pending)
            self._queue.extendleft(reversed(waiting))
            self._last_alone = bool(taken) and not isinstance(taken[0].stimulus, ClientCommand)
            decided: list[tuple[PendingStimulus, Outcome]] = []
            for pending in taken:
                try:
                    decided.append((pending, batch.decide(pending.stimulus, pending.cause_id)))
                except Exception as error:
                    log.exception("deciding a stimulus failed", extra={"cause_id": pending.cause_id})
                    pending.fail(error)
                    replica.core.discard_speculation()  # what it bound before failing goes
            try:
                await self._commit(decided)
            except asyncio.CancelledError:
                for pending, _ in decided:
                    pending.fail(replica.not_leader())
                raise
            except Exception as error:  # NotLeader / StoreUnavailable: the replica stepped down
                log.warning(
                    "batch not committed",
                    extra={"stimuli": len(decided), "error": f"{type(error).__name__}: {error}"},
                )
                for pending, _ in decided:
                    pending.fail(error)

    def _commands_queued(self) -> bool:
        """Whether a client command waits in the queue before any election."""
        for pending in self._queue:
            if isinstance(pending.stimulus, Elected):
                return False
            if isinstance(pending.stimulus, ClientCommand):
                return True
        return False

    async def _commit(self, decided: list[tuple[PendingStimulus, Outcome]]) -> None:
        replica = self.replica
        core = replica.core
        first = core.state.last_sequence + 1
        outcomes = [outcome for _, outcome in decided]
        records = core.records(outcomes, first, core.epoch)
        if records:
            started = time.monotonic()
            await replica.append_and_apply(records)
            self.stats.last_append_s = time.monotonic() - started
            self.stats.append_s_total += self.stats.last_append_s
            self.stats.batches += 1
            self.stats.records += len(records)
        wall = int(time.time() * 1000)
        position = first
        for pending, outcome in decided:
            core.after_commit(outcome, wall)
            if outcome.mutations:
                pending.reply((outcome.answer, position))
                position += len(outcome.mutations)
                self.stats.committed += 1
            else:
                pending.reply((outcome.answer, outcome.position))
