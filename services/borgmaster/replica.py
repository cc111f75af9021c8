"""One Borgmaster replica: a warm copy of the cell, the election, and fenced appends.

Borg §3.1: the Borgmaster is replicated; every replica keeps an in-memory copy of the cell
state, one elected master mutates it, and the state is a checkpoint — snapshots plus a change
log — in the checkpoint store (:mod:`cellpilot.checkpoint_store`). Here:

* every replica starts from the newest snapshot and the log after it;
* a follower tails the log every ``tail_interval_s`` and applies what is new, keeping its copy
  warm; every ``election_interval_s`` it tries to take the lease, which succeeds only once the
  master's lease has expired;
* on promotion it first catches up to the log head — the new epoch fences out any older
  master, so nothing can be appended behind it — then its first append names it the writer
  (``LeaderElected``), and only then it accepts writes and starts its leader work;
* as master, everything that changes the state is a stimulus for the pure core
  (:class:`cellpilot.borg.master_core.MasterCore`) submitted through :meth:`Replica.submit`:
  one queue, decided in batches, each batch one fenced append (:mod:`group_commit`), applied and
  answered only once it is in the log. A refused or failed append makes the master step down,
  discard its speculative bindings and follow the log again.

When the store cannot be reached the master cannot append (and soon cannot renew its lease): a
write then fails with :class:`StoreUnavailable` — retryable, since the log decides whether a
write whose acknowledgement was lost was applied, and a retry with the same request id finds it
there — and the replica remembers the outage (:meth:`store_problem`) so that, while no master is
elected, callers are told why.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from cellpilot.borg.cell_state import CellState
from cellpilot.borg.changes import Change
from cellpilot.borg.lifetime_tracker import LifetimeTracker
from cellpilot.borg.master_core import Elected, MasterCore, MasterRules, Stimulus
from cellpilot.borg.mutations import LogRecord
from cellpilot.borg.scheduling_view import SchedulingView
from cellpilot.borg.soft_state import SoftState
from cellpilot.checkpoint_store import CheckpointStore, FencedOut
from cellpilot.checkpoint_store.store import READ_BATCH
from cellpilot.platform.leadership import Leadership
from cellpilot.platform.store_outage import POSTGRES, StoreUnavailable, describe, store_of
from cellpilot_services.borgmaster.group_commit import GroupCommit
from cellpilot_services.borgmaster.settings import BorgmasterSettings

log = logging.getLogger(__name__)

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


def master_core(settings: BorgmasterSettings) -> MasterCore:
    """The core of one replica: its copy of the cell under the cell's scheduling policy."""
    lifetimes = LifetimeTracker()  # LAS / LAVA (LAVA §4.2-4.3) over the view's cell
    view = settings.scheduling_view(lifetimes)
    rules = MasterRules(
        settings.max_task_failures,
        settings.restart_policy,
        settings.missed_polls_down,
        settings.drain_evictions_per_pass,
        settings.keeps_lava_host_states,
    )
    return MasterCore(view, rules, lifetimes, settings.recent_changes, settings.recent_task_events)


class Replica:
    def __init__(self, settings: BorgmasterSettings, store: CheckpointStore, address: str) -> None:
        self.settings = settings
        self.replica_id = settings.resolved_replica_id
        self.address = address
        self.store = store
        self.lease = store.lease(self.replica_id, address, settings.lease_s)
        self.core = master_core(settings)
        # Serialises what changes the copy: catching up, promotion, a batch's append and apply,
        # stepping down. Private: reads take no lock (the copy changes only between awaits).
        self._changing = asyncio.Lock()
        self.is_leader = False
        self.known_leader: Leadership | None = None
        self.known_leader_at = 0.0  # when the lease last named known_leader (monotonic)
        self.store_error = ""  # why the last contact with PostgreSQL failed ("" = it worked)
        self.store_error_since = 0.0
        self.listeners: list[Listener] = []
        self.leader_work: list[LeaderWork] = []
        self._leader_tasks: list[asyncio.Task[None]] = []
        self.promoted_at = 0.0
        self.group_commit = GroupCommit(self, settings.commit_batch_max)

    # ------------------------------------------------------------------ the copy (read-only views)
    @property
    def state(self) -> CellState:
        return self.core.state

    @property
    def view(self) -> SchedulingView:
        return self.core.view

    @property
    def soft(self) -> SoftState:
        return self.core.soft

    @property
    def epoch(self) -> int:
        return self.core.epoch

    def event_now_ms(self) -> int:
        """The cell's event time (:meth:`MasterCore.event_now_ms`)."""
        return self.core.event_now_ms(now_ms())

    # ------------------------------------------------------------------ following the log
    async def load(self) -> None:
        """Start from the newest snapshot and the log after it (bounded recovery, Borg §3.1)."""
        async with self._changing:
            snapshot = await self.store.latest_snapshot()
            if snapshot is not None:
                self.core.load(snapshot.state, snapshot.sequence)
            else:
                self.core.view.rebuild(self.core.state)
            applied = await self._catch_up()
        log.info(
            "state loaded",
            extra={
                "snapshot": snapshot.sequence if snapshot else 0,
                "records": applied,
                "seq": self.state.last_sequence,
            },
        )

    async def _catch_up(self) -> int:
        """Applies every record after our position (the copy is ours: ``_changing`` is held)."""
        applied = 0
        while True:
            records = await self.store.read(self.state.last_sequence, limit=READ_BATCH)
            if not records:
                return applied
            self.apply(records)
            applied += len(records)
            if len(records) < READ_BATCH:
                return applied

    def apply(self, records: list[LogRecord]) -> None:
        """Committed records into the copy, then to the listeners (the publisher, the poller)."""
        for seq, changes in self.core.apply(records):
            for listener in self.listeners:
                listener(seq, changes)

    # ------------------------------------------------------------------ writes
    async def submit(self, stimulus: Stimulus, cause_id: str = "") -> tuple[Any, int]:
        """The one way the state changes: ``stimulus`` decided by the core, its mutations
        appended (fenced, grouped with others) and applied; returns its answer and log position.

        Raises :class:`NotLeader` (not the master, or deposed by the append) or
        :class:`StoreUnavailable` (the store failed the append): nothing was applied then.
        """
        return await self.group_commit.submit(stimulus, cause_id)

    # Client commands are stimuli like any other; kept for the servicer's wording.
    execute = submit

    async def append_and_apply(self, records: list[LogRecord]) -> None:
        """Appends ``records`` in one transaction (fenced by our epoch), then applies them (the
        caller holds ``_changing`` through :meth:`GroupCommit`). A refused append steps down and
        raises :class:`NotLeader`; a failed one steps down and raises :class:`StoreUnavailable`."""
        if not self.is_leader:
            raise NotLeader(self.leader_address())
        try:
            await self.store.append(self.epoch, records)
        except FencedOut as error:
            await self._step_down(f"append refused: {error}", release=False)
            raise NotLeader(None, str(error)) from error
        except Exception as error:
            self.note_store_failure(error)
            # The lease cannot be released through a store we cannot reach; it expires.
            await self._step_down(f"append failed: {describe(error)}", release=False)
            raise StoreUnavailable(CHECKPOINT_STORE, error) from error
        self.note_store_reachable()
        self.apply(records)

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
                            await self.step_down("lost the lease", release=False)
                else:
                    async with self._changing:
                        await self._catch_up()
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
                    await self.step_down("could not renew the lease in time", release=False)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.settings.tail_interval_s)

    async def _promote(self, leadership: Leadership) -> None:
        started = time.monotonic()
        async with self._changing:
            self.core.epoch = leadership.token
            # The new epoch fences every older master: the log up to its head is now final.
            await self._catch_up()
            self.is_leader = True
        # Queued before any client write can be (nothing yields in between): the first record of
        # the new epoch names its writer.
        try:
            await self.submit(Elected(self.replica_id, self.address, leadership.token))
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
            return  # the append that failed has already stepped down
        except Exception as error:
            if store_of(error, default=POSTGRES) is None:
                log.exception("leader work failed; stepping down", extra={"replica_id": self.replica_id})
                await self.step_down("leader work failed", release=True)
            else:  # e.g. a snapshot write: the store is gone, and the lease with it soon
                self.note_store_failure(error)
                await self.step_down(f"leader work failed: {describe(error)}", release=False)

    async def step_down(self, reason: str, release: bool = True) -> None:
        """Stop leading: cancel leader work, drop speculative bindings and soft state."""
        async with self._changing:
            await self._step_down(reason, release)

    async def _step_down(self, reason: str, release: bool) -> None:
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
        self.core.step_down()
        self.group_commit.refuse_queued(self.not_leader())
        if release:
            with contextlib.suppress(Exception):
                await self.lease.release()

    async def shutdown(self) -> None:
        tasks = list(self._leader_tasks)
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
            since = self.core.records_since_snapshot
            due = since >= self.settings.snapshot_every_records or (
                since and time.monotonic() - last >= self.settings.snapshot_interval_s
            )
            if due:
                await self.write_snapshot()
                last = time.monotonic()

    async def write_snapshot(self) -> int:
        # Nothing is applied while the store encodes the state (off the event loop, so reads
        # and the lease go on): the snapshot is of one position.
        async with self._changing:
            self.core.records_since_snapshot = 0
            seq = await self.store.write_snapshot(self.state, self.epoch)
        log.info("snapshot written", extra={"seq": seq})
        return seq

    def describe_leader(self) -> dict[str, Any]:
        return {"replica_id": self.replica_id, "is_leader": self.is_leader, "epoch": self.epoch}
