"""The Borgmaster's checkpoint in PostgreSQL: a fenced, ordered change log plus snapshots.

Borg §3.1: the Borgmaster's state is a checkpoint — a periodic snapshot plus a change
log — kept in a Paxos-based store. Here the log is the ``checkpoint_log`` table: a record
is appended at the next dense sequence number only while the writer's epoch is the
current one. The check takes a share lock on the lease row, and a new election must
update that row, so an election and an append are serialised: once a new epoch is
committed no append of an older epoch can commit (docs/architecture.md rule 7).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from cellpilot.platform.postgres import query, query_one
from cellpilot_services.borgmaster.leader_lease import LEASE_NAME


@dataclass(frozen=True)
class LogEntry:
    seq: int
    epoch: int
    kind: str
    record: bytes


class FencedOut(Exception):  # noqa: N818 - a result, named for what happened
    """The writer's epoch is no longer current (or another writer took the sequence number)."""


class CheckpointLog:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def append(self, epoch: int, first_seq: int, entries: Sequence[tuple[str, bytes]]) -> int:
        """Append ``entries`` at ``first_seq``, ``first_seq + 1``, … in one transaction.

        Returns the last sequence number written. Raises :class:`FencedOut` when ``epoch``
        is not the current leader epoch or the positions are taken; nothing is written then.
        """
        if not entries:
            return first_seq - 1
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
                    [
                        {"seq": first_seq + i, "epoch": epoch, "kind": kind, "record": record}
                        for i, (kind, record) in enumerate(entries)
                    ],
                )
        except IntegrityError as error:
            raise FencedOut(f"log position {first_seq} is already taken: {error.orig}") from error
        return first_seq + len(entries) - 1

    async def read(self, after_seq: int, up_to_seq: int | None = None, limit: int = 5000) -> list[LogEntry]:
        """Records with ``after_seq < seq <= up_to_seq`` in order (at most ``limit``)."""
        rows = await query(
            self.engine,
            "SELECT seq, epoch, kind, record FROM checkpoint_log"
            " WHERE seq > :after AND (CAST(:upto AS bigint) IS NULL OR seq <= :upto)"
            " ORDER BY seq LIMIT :limit",
            {"after": after_seq, "upto": up_to_seq, "limit": limit},
        )
        return [LogEntry(int(r.seq), int(r.epoch), str(r.kind), bytes(r.record)) for r in rows]

    async def last_seq(self) -> int:
        async with self.engine.connect() as conn:
            value = await conn.scalar(text("SELECT COALESCE(MAX(seq), 0) FROM checkpoint_log"))
        return int(value or 0)

    async def write_snapshot(self, seq: int, epoch: int, state: bytes) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO checkpoint_snapshot (seq, epoch, state) VALUES (:seq, :epoch, :state)"
                    " ON CONFLICT (seq) DO NOTHING"
                ),
                {"seq": seq, "epoch": epoch, "state": state},
            )

    async def latest_snapshot(self, at_or_before: int | None = None) -> tuple[int, bytes] | None:
        """The newest snapshot whose sequence is <= ``at_or_before`` (or the newest of all)."""
        row = await query_one(
            self.engine,
            "SELECT seq, state FROM checkpoint_snapshot"
            " WHERE CAST(:limit AS bigint) IS NULL OR seq <= :limit ORDER BY seq DESC LIMIT 1",
            {"limit": at_or_before},
        )
        return None if row is None else (int(row.seq), bytes(row.state))
