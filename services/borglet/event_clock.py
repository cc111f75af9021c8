"""The Borglet's event clock: simulated time running ``speedup`` times faster than the wall.

Every sample and event the Borglet produces carries event time from this clock (ms since
the Unix epoch), so a fleet can run faster than real time and everything downstream works
from the messages' times, never from its own wall clock (DESIGN.md, "Event time"). This is
the only place the Borglet reads the wall clock for event time.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class EventClock:
    def __init__(
        self,
        speedup: float = 1.0,
        start_ms: int | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall_ms: Callable[[], int] | None = None,
    ) -> None:
        if speedup <= 0:
            raise ValueError(f"speedup must be > 0, got {speedup}")
        self.speedup = float(speedup)
        self._monotonic = monotonic
        self._origin_wall = monotonic()
        self.start_ms = int(start_ms if start_ms is not None else (wall_ms or _wall_ms)())

    def now_ms(self) -> int:
        """Event time now: the start plus the wall time elapsed, scaled by the speed-up."""
        return self.start_ms + int((self._monotonic() - self._origin_wall) * self.speedup * 1000.0)

    def wall_seconds_until(self, event_ms: int) -> float:
        """Wall seconds until the clock reads ``event_ms`` (0 if it already has)."""
        return max(0.0, (event_ms - self.now_ms()) / 1000.0 / self.speedup)


def _wall_ms() -> int:
    return int(time.time() * 1000)
