"""Crash loops back off: when a failed task may run again, and which machines it avoids.

Borg §4 reschedules failed tasks, and "the scheduler avoids task::machine pairings that cause
crashes"; a task that dies at once must not be restarted at the speed of the poll loop, or a
few hundred crash-looping tasks flood the checkpoint log and the scheduler. So:

* **Backoff.** A task that failed (its own fault: OOM, an error exit, a failure to start or
  to run on its Borglet) is not rescheduled before ``failed_at + delay``, where the delay
  starts at ``initial_delay_ms`` and grows by ``factor`` with every failure in a row, up to
  ``max_delay_ms``. A failure after the incarnation ran ``reset_after_ms`` without failing
  counts as the first again. With the defaults (1 s doubling to 5 min) a task that crashes
  at once is restarted 7 times in its first minute and then every 5 minutes: the log
  records of a crash loop are bounded by construction.
* **Anti-affinity.** A task that failed ``crash_threshold`` times on one machine within
  ``crash_window_ms`` avoids that machine for ``avoid_ms`` (a hard constraint with an
  expiry): it moves elsewhere, and "why pending" says so.
* **Not the task's fault.** LOST (its machine went down, Borg §3.3), EVICTED and PREEMPTED
  are the system's doing: they neither count as failures nor delay the restart. A machine
  that fails is dealt with by marking it down, not by slowing down its tasks.

The decision is taken once, when the failure is diffed from a poll, and recorded in the log
(:class:`cellpilot.borg.mutations.RestartBackoff`): replaying the log gives the same
backoff whatever the policy in force at replay time. All times are event times.
"""

from __future__ import annotations

from dataclasses import dataclass

from cellpilot.borg.lifecycle import TaskEvent
from cellpilot.borg.mutations import RestartBackoff
from cellpilot.borg.records import TaskRecord

# The events that are the task's own failure, and back off.
FAILURE_EVENTS = frozenset({TaskEvent.OOM, TaskEvent.FAILED, TaskEvent.FAILED_FOR_GOOD})
# How many of its last failures a task remembers (for the anti-affinity decision).
KEPT_FAILURES = 8


@dataclass(frozen=True)
class RestartPolicy:
    initial_delay_ms: int = 1_000
    factor: float = 2.0
    max_delay_ms: int = 300_000
    reset_after_ms: int = 600_000
    crash_threshold: int = 3
    crash_window_ms: int = 600_000
    avoid_ms: int = 1_800_000

    def __post_init__(self) -> None:
        if self.initial_delay_ms < 0 or self.max_delay_ms < self.initial_delay_ms:
            raise ValueError("restart delays must satisfy 0 <= initial_delay_ms <= max_delay_ms")
        if self.factor < 1.0:
            raise ValueError("the backoff factor must be >= 1")
        if self.crash_threshold < 1 or min(self.reset_after_ms, self.crash_window_ms, self.avoid_ms) < 0:
            raise ValueError("crash_threshold must be >= 1 and the windows >= 0")

    def delay_ms(self, failures: int) -> int:
        """The wait before restarting a task that has failed ``failures`` times in a row (>= 1)."""
        return int(backoff_delay(failures, self.initial_delay_ms, self.factor, self.max_delay_ms))


def backoff_delay(failures: int, initial: float, factor: float, cap: float) -> float:
    """Exponential backoff: the wait after ``failures`` failures in a row (0 before the first).

    ``initial`` after the first, growing by ``factor`` with each further one, never above
    ``cap``. In whatever unit the caller's times are; the Borglet-task restarts above and the
    local stack's service restarts (:mod:`cellpilot.stack.restart_policy`) both use it.
    """
    if failures <= 0:
        return 0
    delay = float(initial)
    for _ in range(failures - 1):
        if delay == 0.0:
            break
        delay *= factor
        if delay >= cap:
            return cap
    return min(delay, cap)


def restart_backoff(
    policy: RestartPolicy, task: TaskRecord, machine_id: str, failed_at_ms: int, ran_ms: int | None
) -> RestartBackoff:
    """The restart decision for ``task`` failing on ``machine_id`` at ``failed_at_ms``.

    ``ran_ms`` is how long the failed incarnation ran (None if unknown, which does not reset).
    """
    clean = ran_ms is not None and ran_ms >= policy.reset_after_ms
    failures = 1 if clean else task.failures + 1
    here = [
        at
        for machine, at in task.recent_failures
        if machine == machine_id and 0 <= failed_at_ms - at < policy.crash_window_ms
    ]
    avoid_until = failed_at_ms + policy.avoid_ms if len(here) + 1 >= policy.crash_threshold else 0
    return RestartBackoff(
        failures=failures,
        not_before_ms=failed_at_ms + policy.delay_ms(failures),
        failed_at_ms=failed_at_ms,
        machine_id=machine_id,
        avoid_until_ms=avoid_until,
    )


def record_failure(task: TaskRecord, backoff: RestartBackoff, kind: TaskEvent, detail: str) -> None:
    """Applies a recorded restart decision to the task (called only from ``CellState.apply``)."""
    task.failures = backoff.failures
    task.not_before_ms = backoff.not_before_ms
    task.last_failure = f"{kind.value}: {detail}" if detail else kind.value
    task.last_failure_ms = backoff.failed_at_ms
    failures = (*task.recent_failures, (backoff.machine_id, backoff.failed_at_ms))
    task.recent_failures = failures[-KEPT_FAILURES:]
    task.avoid = {m: until for m, until in task.avoid.items() if until > backoff.failed_at_ms}
    if backoff.avoid_until_ms:
        task.avoid[backoff.machine_id] = backoff.avoid_until_ms


def clear_backoff(task: TaskRecord) -> None:
    """A new binary or spec may fix what made the task crash: it starts with a clean slate."""
    task.failures, task.not_before_ms = 0, 0
    task.recent_failures, task.avoid = (), {}


def avoided_machines(task: TaskRecord, now_ms: int) -> tuple[tuple[str, int], ...]:
    """Machines the task is kept off at ``now_ms``, with the time each avoidance ends."""
    return tuple(sorted((m, until) for m, until in task.avoid.items() if until > now_ms))
