"""The actuator's admission check for one actuation: replay, stale leader, or apply.

Autopilot §3.1 passes the elected master's decisions to the Borgmaster "via an actuator
job"; docs/architecture.md rule 7 makes every write of an elected leader fenced. The actuator
therefore refuses:

* a **replay**: an idempotency key it has already settled (Kafka redelivery after a crash,
  or the same decision published twice) is a no-op;
* a **stale leader**: a fencing token lower than the highest it has accepted means the
  master that decided it has been deposed since.

It also knows which spec versions of a job its own applied actuations made. The master
decides each job on the spec version it observed and sends it as the version the update
expects, so that a user's concurrent edit is never overwritten. But the master decides again
as soon as the next window's recommendations arrive, often before its previous actuation
reached the Borgmaster; that newer decision names the version its own predecessor replaced.
:meth:`expected_version` moves such an actuation onto the version the actuator's own chain
of updates produced (the targets are absolute, and the Borgmaster still checks the expected
version atomically), so only a change made by someone else refuses it (CONFLICT), as Borg
§3.4's master refuses a scheduler's assignment made on out-of-date state.

Pure state; the actuator persists :attr:`highest_token` and the settled keys (Redis). The
chains of own versions live only in memory: after an actuator restart a newer decision made
on a replaced version is refused as before, and the next window's decision applies.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from enum import StrEnum


class Admission(StrEnum):
    APPLY = "apply"
    DUPLICATE = "duplicate"
    FENCED = "fenced"


@dataclass
class ActuationGuard:
    highest_token: int = 0
    remember_keys: int = 100_000  # settled keys kept in memory (oldest forgotten first)
    remember_jobs: int = 100_000  # jobs whose own-version chain is kept (oldest forgotten first)
    _settled: OrderedDict[str, str] = field(default_factory=OrderedDict)
    # job -> (first, last): every version after ``first`` up to ``last`` was made by an
    # update this actuator applied (each expected the version the previous one produced).
    _own_versions: OrderedDict[str, tuple[int, int]] = field(default_factory=OrderedDict)

    def admit(self, key: str, fencing_token: int) -> Admission:
        if key in self._settled:
            return Admission.DUPLICATE
        if fencing_token < self.highest_token:
            return Admission.FENCED
        return Admission.APPLY

    def accept_token(self, fencing_token: int) -> None:
        """An actuation with this token reached the Borgmaster: older leaders are fenced off."""
        self.highest_token = max(self.highest_token, fencing_token)

    def settle(self, key: str, outcome: str) -> None:
        self._settled[key] = outcome
        self._settled.move_to_end(key)
        while len(self._settled) > self.remember_keys:
            self._settled.popitem(last=False)

    def outcome_of(self, key: str) -> str | None:
        return self._settled.get(key)

    def expected_version(self, job_id: str, based_on: int) -> int:
        """The spec version to send an update decided on ``based_on`` with: the last version of
        this actuator's own chain when ``based_on`` is a version that chain replaced, else
        ``based_on`` itself (0, "no check", stays 0)."""
        chain = self._own_versions.get(job_id)
        if based_on and chain is not None and chain[0] <= based_on < chain[1]:
            return chain[1]
        return based_on

    def applied(self, job_id: str, expected: int, result_version: int) -> None:
        """An update expecting ``expected`` was applied and left the job at ``result_version``."""
        if not expected or result_version <= expected:
            self._own_versions.pop(job_id, None)  # unchecked: nothing proves the chain whole
            return
        chain = self._own_versions.get(job_id)
        first = chain[0] if chain is not None and chain[1] == expected else expected
        self._own_versions[job_id] = (first, result_version)
        self._own_versions.move_to_end(job_id)
        while len(self._own_versions) > self.remember_jobs:
            self._own_versions.popitem(last=False)
