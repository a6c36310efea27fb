"""A token bucket: at most ``burst`` operations at once, then ``rate`` per second on average."""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio

from ._errors import SandboxValidationError

__all__ = ["TokenBucket", "TokenBucketStatistics"]


@dataclass(frozen=True, slots=True)
class TokenBucketStatistics:
    """A snapshot of a ``TokenBucket``: tokens available now, callers waiting, tokens handed out."""

    rate: float
    burst: int
    tokens: float
    waiting: int
    acquired: int


class TokenBucket:
    """Tokens refill continuously at ``rate`` per second, up to ``burst``; each operation takes one.

    ``await bucket.acquire()`` returns at once while tokens remain and otherwise sleeps
    until one has refilled. Waiters are served in arrival order (an ``anyio.Lock`` is
    fair). A waiter that is cancelled takes no token. ``clock`` and ``sleep`` can be
    replaced (tests drive them by hand); by default they are ``time.monotonic`` and
    ``anyio.sleep``.

    Raises ``SandboxValidationError`` for a rate that is not a positive finite number
    or a burst below 1.
    """

    def __init__(
        self,
        rate: float,
        burst: int | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
    ) -> None:
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate <= 0:
            raise SandboxValidationError(f"rate must be a positive number per second, got {rate!r}")
        if burst is None:
            burst = max(1, math.ceil(rate))
        if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
            raise SandboxValidationError(f"burst must be an int >= 1, got {burst!r}")
        self.rate = float(rate)
        self.burst = burst
        self._clock = clock
        self._sleep = sleep
        self._tokens = float(burst)
        self._updated = clock()
        self._lock = anyio.Lock()
        self._waiting = 0
        self._acquired = 0

    def _refill(self) -> None:
        now = self._clock()
        elapsed = max(0.0, now - self._updated)
        self._tokens = min(float(self.burst), self._tokens + elapsed * self.rate)
        self._updated = now

    def try_acquire(self) -> bool:
        """Take a token if one is available now and nobody is queued ahead; never waits."""
        if self._waiting:
            return False
        self._refill()
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            self._acquired += 1
            return True
        return False

    async def acquire(self) -> None:
        """Wait for a token and take it (first come, first served)."""
        self._waiting += 1
        try:
            async with self._lock:
                self._refill()
                while self._tokens < 1.0:
                    await self._sleep((1.0 - self._tokens) / self.rate)
                    self._refill()
                self._tokens -= 1.0
                self._acquired += 1
        finally:
            self._waiting -= 1

    def statistics(self) -> TokenBucketStatistics:
        self._refill()
        return TokenBucketStatistics(
            rate=self.rate, burst=self.burst, tokens=self._tokens, waiting=self._waiting, acquired=self._acquired
        )

    def __repr__(self) -> str:
        return f"<TokenBucket rate={self.rate:g}/s burst={self.burst}>"
