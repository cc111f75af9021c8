"""LARS (§4.4, §5.1, §6.3): lifetime-aware ordering of the VM migrations that drain hosts.

When hosts are drained for defragmentation or maintenance, their VMs are live
migrated a few at a time: §5.1 limits migrations in flight to batches of 3 and
§4.4 models each as keeping both hosts busy for 20 minutes. VMs wait for a slot,
and some exit while waiting, which saves their migration. The baseline migrates in
trace order; LARS migrates the VMs with the longest predicted remaining lifetime
first, across all hosts being drained (§6.3), so that short-lived VMs get the time
to exit on their own.

:func:`replay_migrations` is §5.1's LARS experiment: a fixed list of migration
requests served in a given order through the slots, counting the migrations that
actually happen.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from cellpilot.array_types import FloatArray, Int64Array

MIGRATION_SLOTS = 3  # §5.1: live migrations in progress at a time
MIGRATION_SECONDS = 20 * 60.0  # §4.4: both hosts busy for a conservative 20 minutes


class MigrationOrder(StrEnum):
    TRACE = "trace"  # the baseline: in the order the migrations were requested
    LARS = "lars"  # longest predicted remaining lifetime first


def migration_key(order: MigrationOrder, predicted_exit: float, trace_rank: int) -> tuple[float, int]:
    """Sort key of a pending migration (smaller goes first)."""
    if order is MigrationOrder.LARS:
        return (-predicted_exit, trace_rank)
    return (float(trace_rank), trace_rank)


@dataclass(frozen=True)
class MigrationRequests:
    """Migrations asked for by drain rounds; one entry per VM on a drained host."""

    requested: FloatArray  # when the VM's host started draining (s)
    exit: FloatArray  # when the VM actually exits (s)
    predicted_exit: FloatArray  # its predicted exit time when requested (s), for LARS
    trace_rank: Int64Array  # position in the baseline order

    def __post_init__(self) -> None:
        n = self.requested.shape[0]
        if any(a.shape != (n,) for a in (self.exit, self.predicted_exit, self.trace_rank)):
            raise ValueError("migration request columns must have the same length")

    def __len__(self) -> int:
        return int(self.requested.shape[0])


@dataclass(frozen=True)
class ReplayOutcome:
    requested: int
    migrated: int  # migrations started (each keeps a slot for the full duration)
    exited_first: int  # VMs that exited before their turn came


def replay_migrations(
    requests: MigrationRequests,
    order: MigrationOrder,
    slots: int = MIGRATION_SLOTS,
    duration: float = MIGRATION_SECONDS,
) -> ReplayOutcome:
    """Serves the requests through ``slots`` parallel migrations of ``duration`` seconds each.

    A slot that frees at time t takes the first pending request (requested <= t) in
    ``order``; if that VM has exited by t, it needs no migration and the slot takes
    the next one.
    """
    if slots < 1 or duration <= 0:
        raise ValueError("slots must be >= 1 and duration > 0")
    n = len(requests)
    arrival = np.argsort(requests.requested, kind="stable")
    free_at = [float("-inf")] * slots
    heapq.heapify(free_at)
    pending: list[tuple[tuple[float, int], int]] = []
    next_arrival = 0
    migrated = exited = 0
    clock = float("-inf")  # time only moves forward: a slot free "earlier" is free now
    while next_arrival < n or pending:
        t = max(heapq.heappop(free_at), clock)
        if not pending:
            t = max(t, float(requests.requested[arrival[next_arrival]]))
        clock = t
        while next_arrival < n and requests.requested[arrival[next_arrival]] <= t:
            i = int(arrival[next_arrival])
            key = migration_key(order, float(requests.predicted_exit[i]), int(requests.trace_rank[i]))
            heapq.heappush(pending, (key, i))
            next_arrival += 1
        started = False
        while pending:
            _, i = heapq.heappop(pending)
            if requests.exit[i] <= t:
                exited += 1
                continue
            migrated += 1
            started = True
            heapq.heappush(free_at, t + duration)
            break
        if not started:
            heapq.heappush(free_at, t)
    return ReplayOutcome(requested=n, migrated=migrated, exited_first=exited)
