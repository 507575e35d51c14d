"""Token-bucket rate limits, one bucket per API key."""

from __future__ import annotations

from engine.clock import Clock


class TokenBucket:
    def __init__(self, rate: float, burst: float, clock: Clock) -> None:
        self.rate = rate
        self.burst = burst
        self.clock = clock
        self.tokens = burst
        self.updated = clock.now()

    def try_take(self) -> float:
        """0.0 if a request may pass now (and take its token), else the seconds until one may."""
        now = self.clock.now()
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


class RateLimiter:
    """`rate_limit` requests per second per key, with a burst of as many (at least one)."""

    def __init__(self, rate_limit: float | None, clock: Clock) -> None:
        self.rate_limit = rate_limit
        self.clock = clock
        self._buckets: dict[str, TokenBucket] = {}

    def check(self, key: str) -> float:
        if not self.rate_limit:
            return 0.0
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = TokenBucket(self.rate_limit, max(1.0, self.rate_limit), self.clock)
        return bucket.try_take()
