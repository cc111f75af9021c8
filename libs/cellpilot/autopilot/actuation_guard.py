"""The actuator's admission check for one actuation: replay, stale leader, or apply.

Autopilot §3.1 passes the elected master's decisions to the Borgmaster "via an actuator
job"; docs/architecture.md rule 7 makes every write of an elected leader fenced. The actuator
therefore refuses:

* a **replay**: an idempotency key it has already settled (Kafka redelivery after a crash,
  or the same decision published twice) is a no-op;
* a **stale leader**: a fencing token lower than the highest it has accepted means the
  master that decided it has been deposed since.

Pure state; the actuator persists :attr:`highest_token` and the settled keys (Redis).
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
    _settled: OrderedDict[str, str] = field(default_factory=OrderedDict)

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
