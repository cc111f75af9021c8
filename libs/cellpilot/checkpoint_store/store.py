"""The one seam between the Borgmaster and its checkpoint store (Borg §3.1).

Borg keeps the cell's state as a checkpoint — periodic snapshots plus a change log — in a
Paxos-based store, and elects its master through the same store. Everything a replica, the
scheduler, the Fauxmaster (``cellpilot borgmaster replay``) or a study needs of that store is
this small interface, in the core's terms (:class:`LogRecord`, :class:`CellState`):

* :meth:`CheckpointStore.append` — records at the next dense positions, fenced: only the
  holder of the current epoch can append, and a position is written once;
* :meth:`CheckpointStore.read` — records after a position, in order;
* :meth:`CheckpointStore.latest_snapshot` / :meth:`CheckpointStore.write_snapshot`;
* :meth:`CheckpointStore.lease` — the master's lease, whose epoch is the fencing token.

:class:`cellpilot.checkpoint_store.postgres.PostgresCheckpointStore` is its implementation.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from cellpilot.borg.cell_state import CellState
from cellpilot.borg.mutations import LogRecord
from cellpilot.platform.leadership import LeaderLease


class FencedOut(Exception):  # noqa: N818 - a result, named for what happened
    """The writer's epoch is no longer current (or another writer took the log position)."""


@dataclass(frozen=True)
class StoredSnapshot:
    """A snapshot as the store holds it: the state at log position ``sequence``."""

    sequence: int
    epoch: int
    state: CellState


class CheckpointStore(Protocol):
    async def append(self, epoch: int, records: Sequence[LogRecord]) -> int:
        """Appends ``records`` (dense positions following the log's head) in one atomic step;
        returns the last position written. Raises :class:`FencedOut` when ``epoch`` is not the
        current lease's epoch or a position is taken: nothing is written then."""
        ...

    async def read(self, after_seq: int, up_to_seq: int | None = None, limit: int = 5000) -> list[LogRecord]:
        """Records with ``after_seq < sequence <= up_to_seq`` in order (at most ``limit``)."""
        ...

    async def last_sequence(self) -> int:
        """The log's head (0 for an empty log)."""
        ...

    async def latest_snapshot(self, at_or_before: int | None = None) -> StoredSnapshot | None:
        """The newest snapshot at or before ``at_or_before`` (or the newest of all)."""
        ...

    async def write_snapshot(self, state: CellState, epoch: int) -> int:
        """Stores ``state`` as the snapshot at its ``last_sequence``; returns that position. The
        caller keeps ``state`` unchanged until it returns (it may be encoded off the event loop)."""
        ...

    def lease(self, replica_id: str, address: str, lease_s: float) -> LeaderLease:
        """One replica's side of the master election (the lease's epoch fences :meth:`append`)."""
        ...

    async def close(self) -> None: ...


READ_BATCH = 5_000


async def batches_after(
    store: CheckpointStore, after_seq: int, up_to_seq: int | None = None, batch: int = READ_BATCH
) -> AsyncIterator[list[LogRecord]]:
    """Every record after ``after_seq`` (up to ``up_to_seq``), in order, ``batch`` at a time."""
    while up_to_seq is None or after_seq < up_to_seq:
        records = await store.read(after_seq, up_to_seq, limit=batch)
        if not records:
            return
        yield records
        after_seq = records[-1].sequence
        if len(records) < batch:
            return
