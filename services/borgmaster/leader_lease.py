"""Leadership of the Borgmaster replicas: an epoch with a lease, held in PostgreSQL.

Exactly one replica holds the lease at a time. Taking it over (after it expired) bumps
the epoch, which is the fencing token: every checkpoint-log append checks it under a
row lock (see :mod:`checkpoint_log`), so a deposed master that still believes it leads
can never append (Borg §3.1 uses Paxos for the same guarantee; docs/architecture.md rule 7).

Lease times use the database clock (``now()``), so replicas need no synchronised clocks.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

LEASE_NAME = "borgmaster"


@dataclass(frozen=True)
class Leadership:
    epoch: int
    holder: str
    address: str


class LeaderLease:
    def __init__(self, engine: AsyncEngine, replica_id: str, address: str, lease_s: float) -> None:
        self.engine = engine
        self.replica_id = replica_id
        self.address = address
        self.lease_s = lease_s

    async def try_acquire(self) -> Leadership | None:
        """Become leader if nobody holds a live lease; returns the new leadership (new epoch)."""
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
                    {
                        "me": self.replica_id,
                        "address": self.address,
                        "lease": self.lease_s,
                        "name": LEASE_NAME,
                    },
                )
            ).first()
        if row is None:
            return None
        return Leadership(int(row.epoch), self.replica_id, self.address)

    async def renew(self, epoch: int) -> bool:
        """Extend our lease; False means we lost it (another epoch began) and must step down."""
        async with self.engine.begin() as conn:
            row = (
                await conn.execute(
                    text(
                        "UPDATE leader_lease SET expires_at = now() + make_interval(secs => :lease)"
                        " WHERE name = :name AND epoch = :epoch AND holder = :me AND expires_at > now()"
                        " RETURNING epoch"
                    ),
                    {"lease": self.lease_s, "name": LEASE_NAME, "epoch": epoch, "me": self.replica_id},
                )
            ).first()
        return row is not None

    async def release(self, epoch: int) -> None:
        """Give the lease up at once (clean shutdown), so a successor need not wait for expiry."""
        async with self.engine.begin() as conn:
            await conn.execute(
                text(
                    "UPDATE leader_lease SET expires_at = now() - interval '1 second'"
                    " WHERE name = :name AND epoch = :epoch AND holder = :me"
                ),
                {"name": LEASE_NAME, "epoch": epoch, "me": self.replica_id},
            )

    async def current(self) -> Leadership | None:
        """Who leads now (None if the lease has expired)."""
        async with self.engine.connect() as conn:
            row = (
                await conn.execute(
                    text(
                        "SELECT epoch, holder, address FROM leader_lease"
                        " WHERE name = :name AND expires_at > now()"
                    ),
                    {"name": LEASE_NAME},
                )
            ).first()
        return None if row is None else Leadership(int(row.epoch), str(row.holder), str(row.address))
