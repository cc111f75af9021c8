"""Where the Borgmaster's lease lives: one row of PostgreSQL, whose epoch is the fencing token.

Exactly one replica holds the lease at a time. Taking it over (after it expired) bumps
the epoch, which is the fencing token: every checkpoint-log append checks it under a
row lock (see :mod:`checkpoint_log`), so a deposed master that still believes it leads
can never append (Borg §3.1 uses Paxos for the same guarantee; docs/architecture.md rule 7).
The term and its renewal are :class:`cellpilot.platform.leadership.LeaderLease`'s.

Lease times use the database clock (``now()``), so replicas need no synchronised clocks.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from cellpilot.platform.leadership import LeaderLease, Leadership
from cellpilot.platform.postgres import query, query_one

LEASE_NAME = "borgmaster"


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


def leader_lease(engine: AsyncEngine, replica_id: str, address: str, lease_s: float) -> LeaderLease:
    """The Borgmaster's lease: the master stops leading once a lease period passed unrenewed."""
    return LeaderLease(PostgresLeaseStore(engine), replica_id, address, lease_s)
