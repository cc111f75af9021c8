"""When a supervised process that died is started again, and when the supervisor gives up on it.

Borg restarts a task that fails (Borg §2.3, "tasks are restarted when they fail"), and a task
that keeps failing is not retried as fast as it dies (a crash loop backs off). This is that
policy for the processes ``cellpilot run`` supervises (the delay is the Borgmaster's own
:func:`cellpilot.borg.restart_backoff.backoff_delay`), kept as plain data and decisions with
``now`` passed in: the shell that watches processes asks :meth:`RestartHistory.decide` what to
do after each death and acts on the answer.

* Backoff: the k-th consecutive quick death waits ``initial_backoff_s * 2**(k-1)``, capped at
  ``max_backoff_s``. A process that stayed up ``stable_after_s`` counts as healthy again, so
  its next death starts the backoff over.
* Give up: a process already restarted ``max_restarts`` times within the last ``window_s``
  seconds is not restarted again when it dies.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from cellpilot.borg.restart_backoff import backoff_delay


@dataclass(frozen=True)
class RestartPolicy:
    initial_backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    max_restarts: int = 5
    window_s: float = 300.0
    stable_after_s: float = 60.0

    def __post_init__(self) -> None:
        if self.initial_backoff_s < 0:
            raise ValueError(f"initial_backoff_s must be >= 0, got {self.initial_backoff_s}")
        if self.max_backoff_s < self.initial_backoff_s:
            raise ValueError(
                f"max_backoff_s ({self.max_backoff_s}) must be >= initial_backoff_s "
                f"({self.initial_backoff_s})"
            )
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {self.max_restarts}")
        if self.window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {self.window_s}")
        if self.stable_after_s <= 0:
            raise ValueError(f"stable_after_s must be > 0, got {self.stable_after_s}")


@dataclass(frozen=True)
class RestartDecision:
    """What to do about one death: restart after ``delay_s``, or give up."""

    give_up: bool
    delay_s: float
    # Restarts within the policy's window before this death (the give-up count).
    recent_restarts: int


@dataclass
class RestartHistory:
    """The deaths and restarts of one supervised process (one service replica or component)."""

    policy: RestartPolicy
    restarts: int = 0  # every restart so far
    consecutive_quick_deaths: int = 0
    _restart_times: deque[float] = field(default_factory=deque)

    def decide(self, now: float, uptime_s: float) -> RestartDecision:
        """The process died at ``now`` after running ``uptime_s``; records a planned restart."""
        policy = self.policy
        while self._restart_times and now - self._restart_times[0] >= policy.window_s:
            self._restart_times.popleft()
        recent = len(self._restart_times)
        if recent >= policy.max_restarts:
            return RestartDecision(give_up=True, delay_s=0.0, recent_restarts=recent)
        if uptime_s >= policy.stable_after_s:
            self.consecutive_quick_deaths = 0
        self.consecutive_quick_deaths += 1
        delay = backoff_delay(
            self.consecutive_quick_deaths, policy.initial_backoff_s, 2.0, policy.max_backoff_s
        )
        self.restarts += 1
        self._restart_times.append(now + delay)
        return RestartDecision(give_up=False, delay_s=delay, recent_restarts=recent)
