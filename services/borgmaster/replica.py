"""One Borgmaster replica: a warm copy of the cell state, the election, and fenced commits.

Borg §3.1: the Borgmaster is replicated; every replica keeps an in-memory copy of the
cell state, one elected master mutates it, and the state is a checkpoint — snapshots plus
a change log. Here:

* every replica starts from the newest snapshot and the log after it;
* a follower tails ``checkpoint_log`` every ``tail_interval_s`` and applies what is new,
  keeping its state and scheduling view warm; every ``election_interval_s`` it tries to
  take the lease, which succeeds only once the master's lease has expired;
* on promotion it first catches up to the log head — the new epoch fences out any older
  master, so nothing can be appended behind it — then appends ``LeaderElected`` and only
  then accepts writes and starts its leader work (scheduler, Borglet poller, publisher,
  snapshots);
* every mutation is appended with the master's epoch *before* it is applied and
  acknowledged (:meth:`Replica.commit`); a refused or failed append makes the master step
  down, discard its speculative scheduling view and follow the log again.

When PostgreSQL cannot be reached the master cannot append (and soon cannot renew its
lease): a write then fails with :class:`StoreUnavailable` — retryable, since the log decides
whether a write whose acknowledgement was lost was applied, and a retry with the same
request id finds it there — and the replica remembers the outage (:meth:`store_problem`)
so that, while no master is elected, callers are told why.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from cellpilot.borg.cell_state import CellState, TaskKey
from cellpilot.borg.changes import Change, TaskChange
from cellpilot.borg.decisions import Command, Result
from cellpilot.borg.lifetime_tracker import LifetimeTracker
from cellpilot.borg.mutations import LeaderElected, LogRecord, Mutation, kind_of, to_records
from cellpilot.borg.scheduling_view import SchedulingView
from cellpilot.platform.leadership import Leadership
from cellpilot.platform.store_outage import POSTGRES, StoreUnavailable, describe, store_of
from cellpilot.schedule import SchedulerConfig, default_profile
from cellpilot_services.borgmaster import checkpoint_codec, convert
from cellpilot_services.borgmaster.checkpoint_log import CheckpointLog, FencedOut
from cellpilot_services.borgmaster.group_commit import GroupCommit
from cellpilot_services.borgmaster.leader_lease import leader_lease
from cellpilot_services.borgmaster.settings import BorgmasterSettings

log = logging.getLogger(__name__)

READ_BATCH = 5_000
CHECKPOINT_STORE = f"{POSTGRES} (the checkpoint store)"
Listener = Callable[[int, list[Change]], None]
LeaderWork = Callable[[], Awaitable[None]]


def now_ms() -> int:
    return int(time.time() * 1000)


class NotLeader(Exception):  # noqa: N818 - a routing result, named for what it says
    """This replica is not the elected master; ``leader`` is the master's address if known."""

    def __init__(self, leader: str | None, reason: str = "not the elected master") -> None:
        super().__init__(reason)
        self.leader = leader


class RecentChanges:
    """The changes of the last ``limit`` applied records, by log position (for the publisher)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.first_seq = 1
        self._items: list[list[Change]] = []

    def append(self, seq: int, changes: list[Change]) -> None:
        if not self._items or seq != self.first_seq + len(self._items):
            self.first_seq, self._items = seq, []
        self._items.append(changes)
        if len(self._items) > 2 * self.limit:
            drop = len(self._items) - self.limit
            self.first_seq += drop
            del self._items[:drop]

    @property
    def last_seq(self) -> int:
        return self.first_seq + len(self._items) - 1

    def since(self, seq: int, limit: int = 2_000) -> list[tuple[int, list[Change]]]:
        """Records after ``seq`` (from the oldest kept if ``seq`` is older)."""
        start = max(seq + 1 - self.first_seq, 0)
        chunk = self._items[start : start + limit]
        return [(self.first_seq + start + i, changes) for i, changes in enumerate(chunk)]


class Replica:
    def __init__(self, settings: BorgmasterSettings, engine: AsyncEngine, address: str) -> None:
        self.settings = settings
        self.replica_id = settings.resolved_replica_id
        self.address = address
        self.engine = engine
        self.log = CheckpointLog(engine)
        self.lease = leader_lease(engine, self.replica_id, address, settings.lease_s)
        self.state = CellState()
        self.lifetimes = LifetimeTracker()  # LAS / LAVA (LAVA §4.2-4.3) over the view's cell
        profile = default_profile(
            settings.packing, settings.gpa_rho, settings.placement_policy, self.lifetimes
        )
        self.view = SchedulingView(profile, SchedulerConfig(), settings.scheduler_seed, settings.cpu_learning)
        self.soft = convert.SoftState()
        self.lock = asyncio.Lock()
        self.epoch = 0
        self.is_leader = False
        self.known_leader: Leadership | None = None
        self.known_leader_at = 0.0  # when the lease last named known_leader (monotonic)
        self.store_error = ""  # why the last contact with PostgreSQL failed ("" = it worked)
        self.store_error_since = 0.0
        self.recent = RecentChanges(settings.recent_changes)
        self.task_events: dict[TaskKey, deque[TaskChange]] = {}
        self.listeners: list[Listener] = []
        self.leader_work: list[LeaderWork] = []
        self._leader_tasks: list[asyncio.Task[None]] = []
        self.records_since_snapshot = 0
        self.loaded_snapshot_seq = 0  # the snapshot the state was last loaded from (0: none)
        self.promoted_at = 0.0
        self.group_commit = GroupCommit(self, settings.commit_batch_max)

    # ------------------------------------------------------------------ state
    async def load(self) -> None:
        """Start from the newest snapshot and the log after it (bounded recovery, Borg §3.1)."""
        async with self.lock:
            snapshot = await self.log.latest_snapshot()
            if snapshot is not None:
                self.state = checkpoint_codec.snapshot_in(snapshot[1])
                self.recent = RecentChanges(self.settings.recent_changes)
                self.loaded_snapshot_seq = snapshot[0]
            self.view.rebuild(self.state)
            applied = await self.catch_up()
        log.info(
            "state loaded",
            extra={
                "snapshot": snapshot[0] if snapshot else 0,
                "records": applied,
                "seq": self.state.last_sequence,
            },
        )

    async def catch_up(self) -> int:
        """Applies every record after our position (caller holds the lock)."""
        applied = 0
        while True:
            entries = await self.log.read(self.state.last_sequence, limit=READ_BATCH)
            if not entries:
                return applied
            self._apply([checkpoint_codec.record_in(e.record) for e in entries])
            applied += len(entries)
            if len(entries) < READ_BATCH:
                return applied

    def _apply(self, records: list[LogRecord]) -> None:
        for record in records:
            changes = self.state.apply(record)
            self.view.observe(self.state, changes)
            self.recent.append(record.sequence, changes)
            self.records_since_snapshot += 1
            for change in changes:
                if isinstance(change, TaskChange):
                    key = (change.job_id, change.task_index)
                    events = self.task_events.get(key)
                    if events is None:
                        events = self.task_events[key] = deque(maxlen=self.settings.recent_task_events)
                    events.append(change)
            for listener in self.listeners:
                listener(record.sequence, changes)

    def event_now_ms(self) -> int:
        """The cell's event time: the newest a Borglet reported, or the wall clock if that is later.

        Restart backoffs are stamped in the Borglets' event time (a simulated fleet runs it
        faster than the wall clock), so they are judged against it, never against the wall alone.
        """
        return max(now_ms(), self.soft.latest_event_ms)

    # ------------------------------------------------------------------ writes
    def log_records(
        self,
        first: int,
        mutations: tuple[Mutation, ...] | list[Mutation],
        cause_id: str,
        command: Command | None = None,
        event_time_ms: int | None = None,
    ) -> list[LogRecord]:
        """The log records of ``mutations`` at ``first``, ``first + 1``, … stamped with our epoch.

        ``command`` is the client request the mutations carry out (its id, method and payload
        digest go on the first record).
        """
        return to_records(
            first,
            self.epoch,
            event_time_ms or now_ms(),
            mutations,
            command.request_id if command else "",
            cause_id,
            request_method=command.method if command else "",
            request_digest=command.payload_digest if command else "",
        )

    async def commit_records(self, records: list[LogRecord]) -> None:
        """Appends ``records`` in one transaction (fenced by our epoch), then applies them.

        The caller holds :attr:`lock`, and the records follow the applied position. A refused
        append steps down and raises :class:`NotLeader`; an append that fails (PostgreSQL
        unreachable) steps down and raises :class:`StoreUnavailable`. Nothing was applied
        either way, and the log decides what happened.
        """
        if not self.is_leader:
            raise NotLeader(self.leader_address())
        entries = [(kind_of(r.mutation), checkpoint_codec.record_out(r).SerializeToString()) for r in records]
        try:
            await self.log.append(self.epoch, records[0].sequence, entries)
        except FencedOut as error:
            await self.step_down(f"append refused: {error}", release=False)
            raise NotLeader(None, str(error)) from error
        except Exception as error:
            self.note_store_failure(error)
            # The lease cannot be released through a store we cannot reach; it expires.
            await self.step_down(f"append failed: {describe(error)}", release=False)
            raise StoreUnavailable(CHECKPOINT_STORE, error) from error
        self.note_store_reachable()
        self._apply(records)

    async def commit(
        self,
        mutations: tuple[Mutation, ...] | list[Mutation],
        cause_id: str,
        command: Command | None = None,
        event_time_ms: int | None = None,
    ) -> int:
        """Appends (fenced by our epoch), then applies; returns the first record's position.

        The caller holds :attr:`lock`; failures are those of :meth:`commit_records`.
        """
        if not self.is_leader:
            raise NotLeader(self.leader_address())
        first = self.state.last_sequence + 1
        await self.commit_records(self.log_records(first, mutations, cause_id, command, event_time_ms))
        return first

    async def execute(self, command: Command, cause_id: str) -> tuple[Result, int]:
        """Decide and commit one client command; returns the result and its log position.

        Concurrent commands share one fenced append (:class:`GroupCommit`); each is answered
        only once its own records are committed.
        """
        return await self.group_commit.execute(command, cause_id)

    # ------------------------------------------------------------------ store health
    def note_store_failure(self, error: BaseException) -> None:
        if not self.store_error:
            self.store_error_since = time.monotonic()
            log.warning(
                "checkpoint store unreachable",
                extra={"replica_id": self.replica_id, "error": describe(error)},
            )
        self.store_error = describe(error)

    def note_store_reachable(self) -> None:
        if self.store_error:
            log.info(
                "checkpoint store reachable again",
                extra={
                    "replica_id": self.replica_id,
                    "outage_s": round(time.monotonic() - self.store_error_since, 3),
                },
            )
        self.store_error = ""

    def store_problem(self) -> str | None:
        """Why this replica cannot reach PostgreSQL right now, or None if its last contact worked."""
        if not self.store_error:
            return None
        since = time.monotonic() - self.store_error_since
        return f"{CHECKPOINT_STORE} has been unreachable for {since:.1f} s ({self.store_error})"

    # ------------------------------------------------------------------ leadership
    def not_leader(self) -> NotLeader:
        """What a write gets here while this replica is not the master."""
        return NotLeader(self.leader_address())

    def leader_address(self) -> str | None:
        """The master's address: ours, or the one the lease named within the last lease period
        (an older answer may name a master that is gone, so it is not repeated)."""
        if self.is_leader:
            return self.address
        fresh = time.monotonic() - self.known_leader_at <= self.settings.lease_s
        return self.known_leader.address if self.known_leader and fresh else None

    async def run(self, stop: asyncio.Event) -> None:
        """The election loop: follow and try for the lease, or lead and renew it."""
        next_election = 0.0
        next_renew = 0.0
        while not stop.is_set():
            now = time.monotonic()
            try:
                if self.is_leader:
                    if now >= next_renew:
                        next_renew = now + self.settings.renew_interval_s
                        if await self.lease.renew():
                            self.note_store_reachable()
                        else:
                            await self._locked_step_down("lost the lease", release=False)
                else:
                    async with self.lock:
                        await self.catch_up()
                    self.note_store_reachable()  # a read of the log worked
                    if now >= next_election:
                        next_election = now + self.settings.election_interval_s
                        leadership = await self.lease.try_acquire()
                        if leadership is not None:
                            await self._promote(leadership)
                        else:
                            self.known_leader = await self.lease.current()
                            self.known_leader_at = time.monotonic()
            except asyncio.CancelledError:
                raise
            except Exception as error:
                if store_of(error, default=POSTGRES) is not None:
                    self.note_store_failure(error)
                else:
                    log.exception("replica loop error", extra={"replica_id": self.replica_id})
                if self.is_leader and not self.lease.holds():
                    await self._locked_step_down("could not renew the lease in time", release=False)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.settings.tail_interval_s)

    async def _promote(self, leadership: Leadership) -> None:
        started = time.monotonic()
        async with self.lock:
            self.epoch = leadership.token
            # The new epoch fences every older master: the log up to its head is now final.
            await self.catch_up()
            self.is_leader = True
            try:
                await self.commit(
                    [LeaderElected(self.replica_id, self.address, leadership.token)],
                    f"election-{leadership.token}",
                )
            except (NotLeader, StoreUnavailable):
                return
        self.known_leader = leadership
        self.promoted_at = time.monotonic()
        log.info(
            "elected master",
            extra={
                "replica_id": self.replica_id,
                "epoch": self.epoch,
                "seq": self.state.last_sequence,
                "promotion_s": round(self.promoted_at - started, 3),
            },
        )
        self._leader_tasks = [asyncio.create_task(self._guard(work)) for work in self.leader_work]

    async def _guard(self, work: LeaderWork) -> None:
        try:
            await work()
        except asyncio.CancelledError:
            raise
        except (NotLeader, StoreUnavailable):
            return  # the commit that failed has already stepped down
        except Exception as error:
            if store_of(error, default=POSTGRES) is None:
                log.exception("leader work failed; stepping down", extra={"replica_id": self.replica_id})
                await self._locked_step_down("leader work failed", release=True)
            else:  # e.g. a snapshot write: the store is gone, and the lease with it soon
                self.note_store_failure(error)
                await self._locked_step_down(f"leader work failed: {describe(error)}", release=False)

    async def _locked_step_down(self, reason: str, release: bool) -> None:
        async with self.lock:
            await self.step_down(reason, release)

    async def step_down(self, reason: str, release: bool = True) -> None:
        """Stop leading (caller holds the lock): cancel leader work, drop speculative state."""
        if not self.is_leader:
            return
        self.is_leader = False
        log.warning(
            "stepping down: %s",
            reason,
            extra={"replica_id": self.replica_id, "epoch": self.epoch, "reason": reason},
        )
        current = asyncio.current_task()
        for task in self._leader_tasks:
            if task is not current:
                task.cancel()
        self._leader_tasks = []
        self.known_leader = None
        self.view.rebuild(self.state)
        self.view.forget_cpu()  # soft state: the next master re-learns CPU moments from its polls
        if release:
            with contextlib.suppress(Exception):
                await self.lease.release()

    async def shutdown(self) -> None:
        tasks = list(self._leader_tasks)
        async with self.lock:
            await self.step_down("shutting down", release=True)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ------------------------------------------------------------------ snapshots
    async def snapshot_loop(self) -> None:
        """Leader work: a snapshot every ``snapshot_every_records`` records or ``snapshot_interval_s``."""
        last = time.monotonic()
        while True:
            await asyncio.sleep(1.0)
            due = self.records_since_snapshot >= self.settings.snapshot_every_records or (
                self.records_since_snapshot and time.monotonic() - last >= self.settings.snapshot_interval_s
            )
            if due:
                await self.write_snapshot()
                last = time.monotonic()

    async def write_snapshot(self) -> int:
        async with self.lock:
            data = checkpoint_codec.snapshot_out(self.state, self.epoch).SerializeToString()
            seq = self.state.last_sequence
            self.records_since_snapshot = 0
        await self.log.write_snapshot(seq, self.epoch, data)
        log.info("snapshot written", extra={"seq": seq, "bytes": len(data)})
        return seq

    def describe_leader(self) -> dict[str, Any]:
        return {"replica_id": self.replica_id, "is_leader": self.is_leader, "epoch": self.epoch}
