"""Link shards (Borg §3.3): who polls which machine, and which reports are worth forwarding.

Borg §3.3: "each Borgmaster replica runs a stateless link shard to handle the communication
with some of the Borglets. The partitioning is recalculated whenever a Borgmaster election
occurs. For resiliency, the Borglet always reports its full state, but the link shards
aggregate and compress this information by reporting only differences to the state machines,
to reduce the update load at the elected master."

* :func:`shard_owner` / :func:`partition`: a machine belongs to the member with the highest
  hash of (member, machine) — rendezvous hashing — so the partition depends only on the
  member set, every replica computes the same one, and when a member joins or leaves only
  the machines it gains or loses move.
* :func:`report_digest`: what of a Borglet's full-state report the master's state machines
  act on (the desired-set version applied, each task's incarnation, state, exit reason and
  readiness, the unacknowledged events). Usage is soft state: it changes every sample.
* :func:`must_forward`: a shard forwards a report when its digest differs from the one it
  last forwarded, when the machine just answered again after missed polls or is DOWN in the
  state (the master must see it come back), or when the master's copy of its usage is older
  than the refresh interval (so soft state such as the GPA CPU moments keeps being fed,
  at a lower rate).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cellpilot.borg.lifecycle import TaskEvent, TaskState
from cellpilot.borg.poll_diff import MachineReport


def _weight(member: str, machine_id: str) -> int:
    digest = hashlib.blake2b(f"{member}\x00{machine_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def shard_owner(machine_id: str, members: Sequence[str]) -> str:
    """The member whose link shard polls ``machine_id`` (rendezvous hashing over ``members``)."""
    if not members:
        raise ValueError("members: a partition needs at least one replica")
    return max(members, key=lambda member: (_weight(member, machine_id), member))


def partition(machine_ids: Iterable[str], members: Sequence[str]) -> dict[str, list[str]]:
    """Each member's share of the machines (every member present, shares sorted)."""
    shares: dict[str, list[str]] = {member: [] for member in members}
    for machine_id in sorted(machine_ids):
        shares[shard_owner(machine_id, members)].append(machine_id)
    return shares


@dataclass(frozen=True)
class ReportDigest:
    """The part of a full-state report the master's state machines act on."""

    desired_version: int
    tasks: frozenset[tuple[str, int, int, TaskState, TaskEvent | None, bool]]
    events: tuple[int, ...]  # sequences of the unacknowledged events


def report_digest(report: MachineReport, acked_sequence: int = 0) -> ReportDigest:
    """``acked_sequence``: events up to it were already forwarded and recorded (the Borglet
    keeps them until the next poll tells it so), so they are no news."""
    return ReportDigest(
        report.desired_version,
        frozenset(
            (t.job_id, t.task_index, t.incarnation, t.state, t.exit_reason, t.ready) for t in report.tasks
        ),
        tuple(sorted(e.sequence for e in report.events if e.sequence > acked_sequence)),
    )


def must_forward(
    previous: ReportDigest | None,
    current: ReportDigest,
    *,
    answered_again: bool,
    machine_down: bool,
    last_forward_ms: int | None,
    now_ms: int,
    refresh_ms: int,
) -> bool:
    """Whether a shard forwards this report to the master (see the module docstring)."""
    if previous is None or previous != current or answered_again or machine_down:
        return True
    return last_forward_ms is None or now_ms - last_forward_ms >= refresh_ms


@dataclass(frozen=True)
class Membership:
    """The replicas sharing the polling as the master sees them; ``version`` grows on change."""

    version: int
    members: tuple[str, ...]

    def share(self, member: str, machine_ids: Iterable[str]) -> list[str]:
        """``member``'s machines (none if it is not a member)."""
        if member not in self.members:
            return []
        return partition(machine_ids, self.members)[member]


def next_membership(
    current: Membership, leader: str, last_heard: dict[str, float], now: float, timeout: float
) -> Membership:
    """The members: the leader, and every replica heard from within ``timeout`` (a dead
    replica's machines go to the others; Borg §3.3 re-partitions)."""
    alive = {leader} | {member for member, heard in last_heard.items() if now - heard <= timeout}
    members = tuple(sorted(alive))
    if members == current.members:
        return current
    return Membership(current.version + 1, members)
