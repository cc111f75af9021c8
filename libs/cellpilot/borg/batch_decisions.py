"""Deciding the client commands of one group-commit batch as if one after another.

Group commit (Borg §3.1: many requests share one write to the Paxos store) decides every
command of a batch before any of them is committed, and applies the batch only once the
append succeeded. :class:`BatchDecider` makes that equal to deciding them one at a time:

* quota is carried through the batch: each accepted command's quota effect (a submission
  charged, an update re-charged, a kill released, a quota set) goes to a private copy of
  the quota book that the later commands of the batch are decided against, so concurrent
  submissions of one user share one batch and still cannot overrun the user's quota;
* everything else a decision reads that an earlier command of the batch could change is
  named by :func:`footprint` — the request id, the jobs, the machines whose free room an
  in-place update reads — and a command whose footprint overlaps an earlier one's is
  left for the next batch (:meth:`BatchDecider.admits`), where it is decided against a
  state that holds the earlier one's records. Two requests with one request id are never
  in one batch: the second is answered as a retry of the first, or refused as a reuse.

Conservative by design: a false overlap only costs a command one more batch.
"""

from __future__ import annotations

import copy

from cellpilot.borg.cell_state import CellState, schedule_job
from cellpilot.borg.decisions import (
    Accepted,
    Command,
    InPlaceFit,
    KillJob,
    RegisterMachine,
    Result,
    SetMachineState,
    SubmitJob,
    UpdateJob,
    handle,
)
from cellpilot.borg.lifecycle import TaskState
from cellpilot.borg.mutations import JobKilled, JobSubmitted, JobUpdated, Mutation, QuotaSet
from cellpilot.schedule import QuotaBook

Footprint = frozenset[str]


def _job_keys(state: CellState, job_id: str) -> set[str]:
    """A job, its alloc set, the jobs in it (if it is one), and the machines its live tasks hold."""
    keys = {f"job:{job_id}"}
    job = state.job(job_id)
    if job is None:
        return keys
    if job.spec.alloc_set_job_id:
        keys.add(f"job:{job.spec.alloc_set_job_id}")
    if job.spec.is_alloc_set:  # killing it evicts the jobs running in its allocs
        keys |= {f"job:{o.job_id}" for o in state.jobs.values() if o.spec.alloc_set_job_id == job_id}
    live = (t for t in job.tasks.values() if t.state is not TaskState.DEAD)
    keys |= {f"machine:{t.machine_id}" for t in live if t.machine_id}
    return keys


def footprint(state: CellState, command: Command) -> Footprint:
    """What of ``state`` (besides quota) ``command``'s decision reads or its mutations change."""
    keys: set[str] = {f"request:{command.request_id}"} if command.request_id else set()
    if isinstance(command, SubmitJob):
        keys |= _job_keys(state, command.spec.job_id)
        if command.spec.alloc_set_job_id:
            keys.add(f"job:{command.spec.alloc_set_job_id}")
    elif isinstance(command, UpdateJob):
        keys |= _job_keys(state, command.job_id)
        if command.spec.alloc_set_job_id:
            keys.add(f"job:{command.spec.alloc_set_job_id}")
    elif isinstance(command, KillJob):
        keys |= _job_keys(state, command.job_id)
    elif isinstance(command, RegisterMachine):
        keys.add(f"machine:{command.spec.machine_id}")
    elif isinstance(command, SetMachineState):
        keys.add(f"machine:{command.machine_id}")
    return frozenset(keys)


def charge_quota(book: QuotaBook, mutation: Mutation) -> None:
    """What applying ``mutation`` does to the quota book (as :meth:`CellState.apply` does)."""
    if isinstance(mutation, JobSubmitted):
        book.admit(schedule_job(mutation.spec))
    elif isinstance(mutation, JobUpdated):
        book.update(schedule_job(mutation.spec))
    elif isinstance(mutation, JobKilled):
        book.release(mutation.job_id)
    elif isinstance(mutation, QuotaSet):
        book.set_quota(mutation.user, mutation.band, mutation.limit)


class BatchDecider:
    """Decides one batch against ``state`` (which it never changes; see the module docstring)."""

    def __init__(self, state: CellState, now_ms: int, fit: InPlaceFit | None = None) -> None:
        self.state = state
        self.now_ms = now_ms
        self.fit = fit
        self.touched: set[str] = set()
        self._deciding = state  # becomes a shallow copy with its own quota book once charged
        self._uncharged: list[Mutation] = []

    def admits(self, command: Command) -> bool:
        """Whether ``command`` may join this batch; a refused one still reserves its footprint,
        so that no later command overlapping it overtakes it."""
        keys = footprint(self.state, command)
        fits = not keys & self.touched
        self.touched |= keys
        return fits

    def decide(self, command: Command) -> Result:
        """The command's result against the state plus the batch's earlier acceptances."""
        if self._uncharged:  # the quota book is copied only when a second decision needs it
            if self._deciding is self.state:
                self._deciding = copy.copy(self.state)
                self._deciding.quota_book = self.state.quota_book.copy()
            for mutation in self._uncharged:
                charge_quota(self._deciding.quota_book, mutation)
            self._uncharged = []
        result = handle(self._deciding, command, self.now_ms, self.fit)
        if isinstance(result, Accepted):
            self._uncharged = [
                m for m in result.mutations if isinstance(m, JobSubmitted | JobUpdated | JobKilled | QuotaSet)
            ]
        return result
