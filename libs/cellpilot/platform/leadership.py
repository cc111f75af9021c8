"""Leader election by lease, with a fencing token (docs/architecture.md rule 7).

Replicas of an elected service compete for one lease in a shared store. Taking a free (or
expired) lease starts a new *term* whose fencing token is strictly larger than every earlier
term's; every write the leader makes carries the token, and the stores and services it
writes to refuse a token older than the newest they have seen, so a deposed leader that still
believes it leads can change nothing (Borg §3.1 gets the same guarantee from Paxos). The
leader renews the lease before it expires; a replica that fails to renew steps down.

:class:`LeaderLease` is the part every backend shares: the term held, and a local deadline
(the start of the last successful acquisition or renewal + the lease's length - a margin, on
the monotonic clock) past which the holder stops acting even before the store expires the
lease. A :class:`LeaseStore` is where the lease lives: Redis for the Autopilot master (a key
with a TTL and an INCR'd counter), PostgreSQL for the Borgmaster (a row whose epoch is the
token, timed by the database clock).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Leadership:
    """One term: its fencing token, the replica holding it and the address it is reached at."""

    token: int
    holder: str
    address: str

    def encode(self) -> str:
        """``<token>|<holder>|<address>``, the form a store keeps the term in."""
        return f"{self.token}|{self.holder}|{self.address}"

    @classmethod
    def parse(cls, raw: bytes | str) -> Leadership:
        text = raw.decode() if isinstance(raw, bytes) else raw
        token, holder, address = text.split("|", 2)
        return cls(int(token), holder, address)


class LeaseStore(Protocol):
    """Where a lease lives. Every method is one atomic step in the store."""

    async def acquire(self, holder: str, address: str, lease_s: float) -> int | None:
        """Take the lease if nobody holds a live one: the new term's token, else None."""
        ...

    async def renew(self, term: Leadership, lease_s: float) -> bool:
        """Extend ``term``'s lease; False if it is no longer the live term."""
        ...

    async def release(self, term: Leadership) -> None:
        """End ``term``'s lease at once (if it is still the live term)."""
        ...

    async def current(self) -> Leadership | None:
        """The live term, if any."""
        ...


class LeaderLease:
    """One replica's side of the election over ``store``: the term it holds, if any."""

    def __init__(
        self, store: LeaseStore, replica_id: str, address: str, lease_s: float, margin_s: float = 0.0
    ) -> None:
        self.store = store
        self.replica_id = replica_id
        self.address = address  # may be set once the replica's server knows its port
        self.lease_s = lease_s
        self.margin_s = margin_s
        self.held: Leadership | None = None
        self._valid_until = 0.0

    def holds(self) -> bool:
        """Leader now, by our own clock (stops ``margin_s`` short of the lease's expiry)."""
        return self.held is not None and time.monotonic() < self._valid_until

    async def try_acquire(self) -> Leadership | None:
        """A new term if the lease was free; None if another replica holds a live one."""
        started = time.monotonic()
        token = await self.store.acquire(self.replica_id, self.address, self.lease_s)
        if token is None:
            return None
        self.held = Leadership(token, self.replica_id, self.address)
        self._valid_until = started + self.lease_s - self.margin_s
        return self.held

    async def renew(self) -> bool:
        """Extend the term held; False (and the term dropped) if it was lost."""
        if self.held is None:
            return False
        started = time.monotonic()
        if not await self.store.renew(self.held, self.lease_s):
            self.held = None
            return False
        self._valid_until = started + self.lease_s - self.margin_s
        return True

    async def release(self) -> None:
        """Give the lease up at once (a clean shutdown), so a successor need not wait for expiry."""
        if self.held is not None:
            await self.store.release(self.held)
        self.held = None

    def step_down(self) -> None:
        """Stop holding the term here, without telling the store (it may be unreachable)."""
        self.held = None

    async def current(self) -> Leadership | None:
        return await self.store.current()
