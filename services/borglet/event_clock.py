"""The Borglet's event clock: simulated time running ``speedup`` times faster than the wall.

Every sample and event the Borglet produces carries event time from this clock (ms since
the Unix epoch), so a fleet can run faster than real time and everything downstream works
from the messages' times, never from its own wall clock (docs/architecture.md). This
is the only place the Borglet reads the wall clock for event time.

A sped-up clock that started again from the wall clock would go back in event time after a
restart: the aggregator's windows, the recommenders' and the Autopilot master's state are
already further on, so every new sample would be late and dropped, and the new boot's batch
sequences (which start at its event time) would look like repeats. :class:`ClockAnchor` keeps
how far the clock went in a file, so a restarted Borglet resumes after it: event time never
goes backwards.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path


class EventClock:
    def __init__(
        self,
        speedup: float = 1.0,
        start_ms: int | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall_ms: Callable[[], int] | None = None,
        not_before_ms: int | None = None,
    ) -> None:
        """Starts at ``start_ms`` (else the wall clock), or at ``not_before_ms`` if that is later."""
        if speedup <= 0:
            raise ValueError(f"speedup must be > 0, got {speedup}")
        self.speedup = float(speedup)
        self._monotonic = monotonic
        self._origin_wall = monotonic()
        start = int(start_ms if start_ms is not None else (wall_ms or _wall_ms)())
        self.start_ms = max(start, not_before_ms) if not_before_ms is not None else start

    def now_ms(self) -> int:
        """Event time now: the start plus the wall time elapsed, scaled by the speed-up."""
        return self.start_ms + int((self._monotonic() - self._origin_wall) * self.speedup * 1000.0)

    def wall_seconds_until(self, event_ms: int) -> float:
        """Wall seconds until the clock reads ``event_ms`` (0 if it already has)."""
        return max(0.0, (event_ms - self.now_ms()) / 1000.0 / self.speedup)

    def ms_in(self, wall_s: float) -> int:
        """How much event time passes in ``wall_s`` wall seconds."""
        return int(wall_s * self.speedup * 1000.0)


class ClockAnchor:
    """How far a Borglet's event clock went, in a JSON file (written whole, then renamed)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> int | None:
        """The event time (ms) to resume at; None if no boot wrote one yet."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None
        try:
            return int(json.loads(text)["resume_at_ms"])
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(
                f"{self.path}: not a Borglet clock anchor ({error}); remove it to start afresh"
            ) from error

    def save(self, resume_at_ms: int) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(".partial")
        partial.write_text(json.dumps({"resume_at_ms": int(resume_at_ms)}) + "\n")
        os.replace(partial, self.path)


def _wall_ms() -> int:
    return int(time.time() * 1000)
