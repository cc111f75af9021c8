"""The checkpoint store in PostgreSQL (Borg §3.1): a fenced, ordered change log, snapshots and the
master's lease, behind :class:`cellpilot.checkpoint_store.store.CheckpointStore`.

* The log is the ``checkpoint_log`` table: a record is appended at the next dense position only
  while the writer's epoch is the current one. The check takes a share lock on the lease row,
  and a new election must update that row, so an election and an append are serialised: once a
  new epoch is committed no append of an older epoch can commit (docs/architecture.md rule 7).
* The lease is one ``leader_lease`` row whose epoch is the fencing token. Taking it over (after
  it expired) bumps the epoch; lease times use the database clock (``now()``), so replicas need
  no synchronised clocks. The term and its renewal are
  :class:`cellpilot.platform.leadership.LeaderLease`'s.
* Records and snapshots are stored as ``checkpoint.proto`` bytes
  (:mod:`cellpilot.borg_wire.checkpoint`). A snapshot row names its format (the full name of
  its message, column ``format``): it is written as ``CellSnapshot``; rows of the first format
  (``Snapshot``, the API's statuses) are still read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from cellpilot.borg.cell_state import CellState
from cellpilot.borg.mutations import LogRecord, kind_of
from cellpilot.borg_wire.checkpoint import SNAPSHOT_FORMAT, record_in, record_out, snapshot_in, snapshot_out
from cellpilot.checkpoint_store.store import FencedOut, StoredSnapshot
from cellpilot.platform.leadership import LeaderLease, Leadership
from cellpilot.platform.postgres import create_engine, query, query_one

LEASE_NAME = "borgmaster"


class PostgresCheckpointStore:
    """The checkpoint log, snapshots and lease of one database (its URL names the account)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    @classmethod
    def connect(cls, url: str, pool_size: int = 4) -> PostgresCheckpointStore:
        return cls(create_engine(url, pool_size=pool_size))

    async def close(self) -> None:
        await self.engine.dispose()

    # ------------------------------------------------------------------ the log
    async def append(self, epoch: int, records: Sequence[LogRecord]) -> int:
        if not records:
            raise ValueError("nothing to append")
        first_seq = records[0].sequence
        rows = [
            {
                "seq": r.sequence,
                "epoch": epoch,
                "kind": kind_of(r.mutation),
                "record": record_out(r).SerializeToString(),
            }
            for r in records
        ]
        try:
            async with self.engine.begin() as conn:
                current = await conn.scalar(
                    text("SELECT epoch FROM leader_lease WHERE name = :name FOR SHARE"), {"name": LEASE_NAME}
                )
                if current != epoch:
                    raise FencedOut(f"append by epoch {epoch} refused: the current epoch is {current}")
                await conn.execute(
                    text(
                        "INSERT INTO checkpoint_log (seq, epoch, kind, record)"
                        " VALUES (:seq, :epoch, :kind, :record)"
                    ),
                    rows,
                )
        except IntegrityError as error:
            raise FencedOut(f"log position {first_seq} is already taken: {error.orig}") from error
        return records[-1].sequence

    async def read(self, after_seq: int, up_to_seq: int | None = None, limit: int = 5000) -> list[LogRecord]:
        rows = await query(
            self.engine,
            "SELECT record FROM checkpoint_log"
            " WHERE seq > :after AND (CAST(:upto AS bigint) IS NULL OR seq <= :upto)"
            " ORDER BY seq LIMIT :limit",
            {"after": after_seq, "upto": up_to_seq, "limit": limit},
        )
        return [record_in(bytes(r.record)) for r in rows]

    async def last_sequence(self) -> int:
        async with self.engine.connect() as conn:
            value = await conn.scalar(text("SELECT COALESCE(MAX(seq), 0) FROM checkpoint_log"))
        return int(value or 0)

    # ------------------------------------------------------------------ snapshots
    async def write_snapshot(self, state: CellState, epoch: int) -> int:
        # Encoded off the event loop (a 10 000-machine cell takes seconds); the caller keeps the
        # state from changing until this returns. The position is read before the encoding, so the
        # row says the position its bytes are of.
        seq = state.last_sequence
        data = await asyncio.to_thread(lambda: snapshot_out(state, epoch).SerializeToString())
        async with self.engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO checkpoint_snapshot (seq, epoch, format, state)"
                    " VALUES (:seq, :epoch, :format, :state) ON CONFLICT (seq) DO NOTHING"
                ),
                {"seq": seq, "epoch": epoch, "format": SNAPSHOT_FORMAT, "state": data},
            )
        return seq

    async def latest_snapshot(self, at_or_before: int | None = None) -> StoredSnapshot | None:
        row = await query_one(
            self.engine,
            "SELECT seq, epoch, format, state FROM checkpoint_snapshot"
            " WHERE CAST(:limit AS bigint) IS NULL OR seq <= :limit ORDER BY seq DESC LIMIT 1",
            {"limit": at_or_before},
        )
        if row is None:
            return None
        return StoredSnapshot(int(row.seq), int(row.epoch), snapshot_in(bytes(row.state), str(row.format)))

    # ------------------------------------------------------------------ the lease
    def lease(self, replica_id: str, address: str, lease_s: float) -> LeaderLease:
        """The master stops leading once a lease period passed unrenewed."""
        return LeaderLease(PostgresLeaseStore(self.engine), replica_id, address, lease_s)


class PostgresLeaseStore:
    """The lease as the ``leader_lease`` row named :data:`LEASE_NAME`."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def acquire(self, holder: str, address: str, lease_s: float) -> int | None:
        async with self.engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO leader_lease (name, epoch, holder, address, expires_at)"
                    " VALUES (:name, 0, '', '', now() - interval '1 second') ON CONFLICT (name) DO NOTHING"
                ),
                {"name": LEASE_NAME},
            )
            row = (
                await conn.execute(
                    text(
                        "UPDATE leader_lease SET epoch = epoch + 1, holder = :me, address = :address,"
                        " expires_at = now() + make_interval(secs => :lease)"
                        " WHERE name = :name AND expires_at < now()"
                        " RETURNING epoch"
                    ),
                    {"me": holder, "address": address, "lease": lease_s, "name": LEASE_NAME},
                )
            ).first()
        return None if row is None else int(row.epoch)

    async def renew(self, term: Leadership, lease_s: float) -> bool:
        row = await query_one(
            self.engine,
            "UPDATE leader_lease SET expires_at = now() + make_interval(secs => :lease)"
            " WHERE name = :name AND epoch = :epoch AND holder = :me AND expires_at > now()"
            " RETURNING epoch",
            {"lease": lease_s, "name": LEASE_NAME, "epoch": term.token, "me": term.holder},
            write=True,
        )
        return row is not None

    async def release(self, term: Leadership) -> None:
        await query(
            self.engine,
            "UPDATE leader_lease SET expires_at = now() - interval '1 second'"
            " WHERE name = :name AND epoch = :epoch AND holder = :me RETURNING epoch",
            {"name": LEASE_NAME, "epoch": term.token, "me": term.holder},
            write=True,
        )

    async def current(self) -> Leadership | None:
        """Who leads now (None if the lease has expired)."""
        row = await query_one(
            self.engine,
            "SELECT epoch, holder, address FROM leader_lease WHERE name = :name AND expires_at > now()",
            {"name": LEASE_NAME},
        )
        return None if row is None else Leadership(int(row.epoch), str(row.holder), str(row.address))
