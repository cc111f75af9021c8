"""Token buckets for the actuator's rate limits (Autopilot §3.1: actuation through the
Borgmaster must not swamp it; §2.3: every limit change may move tasks).

Pure: the caller passes the time (seconds on any monotonic clock) and sleeps for the wait
:meth:`TokenBucket.reserve` returns. :class:`KeyedBuckets` keeps one bucket per key (job)
and forgets buckets that have refilled completely.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` saved up; starts full."""

    rate: float
    burst: float
    tokens: float = -1.0
    updated_s: float | None = None

    def __post_init__(self) -> None:
        if self.rate <= 0 or self.burst < 1:
            raise ValueError("need rate > 0 and burst >= 1")
        if self.tokens < 0:
            self.tokens = self.burst

    def _refill(self, now_s: float) -> None:
        if self.updated_s is not None and now_s > self.updated_s:
            self.tokens = min(self.burst, self.tokens + (now_s - self.updated_s) * self.rate)
        if self.updated_s is None or now_s > self.updated_s:
            self.updated_s = now_s

    def reserve(self, now_s: float) -> float:
        """Take one token; returns how long to wait before using it (0 = now)."""
        self._refill(now_s)
        self.tokens -= 1.0
        if self.tokens >= 0:
            return 0.0
        return -self.tokens / self.rate

    def full_at(self, now_s: float) -> bool:
        self._refill(now_s)
        return self.tokens >= self.burst


class KeyedBuckets:
    """One :class:`TokenBucket` per key, created on first use."""

    def __init__(self, rate: float, burst: float, max_keys: int = 100_000) -> None:
        self.rate = rate
        self.burst = burst
        self.max_keys = max_keys
        self._buckets: dict[str, TokenBucket] = {}

    def __len__(self) -> int:
        return len(self._buckets)

    def reserve(self, key: str, now_s: float) -> float:
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= self.max_keys:
                self._forget_full(now_s)
            bucket = self._buckets[key] = TokenBucket(self.rate, self.burst)
        return bucket.reserve(now_s)

    def _forget_full(self, now_s: float) -> None:
        for key in [k for k, b in self._buckets.items() if b.full_at(now_s)]:
            del self._buckets[key]
