"""How many creations a pool runs at once: an AIMD cap driven by measured create latency and failures.

Creating a sandbox costs the backend something: CPU on this machine for the local
backend, API calls and scheduling for Kubernetes. Up to some concurrency, more creations
at once finish more per second; past it they only queue and each takes longer (and on a
local machine they take CPU from the rollouts running beside them). The pacer finds that
point from what it measures, as TCP's congestion control does:

- ``latency`` is the median of the last ``WINDOW`` successful creates (only those started
  since the last shrink: they measured the current cap). ``baseline`` is the first such
  median, taken while slow start begins at ``INITIAL`` creations at once; it follows
  lower medians a share (``BASELINE_FOLLOW``) at a time and drifts up by
  ``BASELINE_DRIFT`` per sample otherwise, so it re-learns a machine that got faster or
  slower without chasing noise (a minimum of noisy medians would sit low and read noise
  as congestion: Kubernetes create times vary by 5x at p99).
- While ``latency <= tolerance * baseline`` and the cap is what limits creation, it grows:
  by one per completed create at first ("slow start", doubling per round trip), by one per
  ``limit`` completions once latency has risen halfway to the tolerance or after the first
  back-off.
- When latency rises above that, or an attempt fails, it shrinks multiplicatively
  (``DECREASE``, ``FAILURE_DECREASE``), at most once per round of creates started after
  the previous shrink, and never below 1.

A fixed ``create_concurrency`` turns adaptation off. ``create_rate`` adds a rate limit on
attempts (``aiolimiter``'s leaky bucket), for backends with a quota per second.
"""

from __future__ import annotations

import statistics
from collections import deque

import anyio
from aiolimiter import AsyncLimiter

__all__ = ["Pacer"]


class Pacer:
    """The creation cap (``limit``) and the optional rate limit of one pool."""

    #: Successful creates whose median is the current latency.
    WINDOW = 12
    #: Samples in the window before latency may shrink the cap.
    DECIDE_AFTER = 6
    #: Relative upward drift of the baseline per sample (re-learns a machine 4x as slow in about 1,000 creates).
    BASELINE_DRIFT = 0.002
    #: Share of the way to a lower median the baseline moves per sample.
    BASELINE_FOLLOW = 0.1
    #: Multiplicative decrease on rising latency, and on a failed attempt.
    DECREASE = 0.7
    FAILURE_DECREASE = 0.5
    #: The cap a pool starts with (slow start grows it from there).
    INITIAL = 2
    #: Slow start ends once latency has risen this share of the way to ``tolerance * baseline``.
    SLOW_START_EXIT = 0.5

    def __init__(
        self,
        *,
        fixed: int | None,
        ceiling: int,
        tolerance: float,
        rate: float | None = None,
        burst: int = 1,
    ) -> None:
        self._fixed = fixed
        self._ceiling = max(1, ceiling)
        self._tolerance = tolerance
        self._limit = float(fixed if fixed is not None else min(self.INITIAL, self._ceiling))
        self._samples: deque[float] = deque(maxlen=self.WINDOW)
        self._baseline: float | None = None
        self._last_latency: float | None = None
        self._slow_start = True
        self._decreased_at = -1.0  # loop time of the last shrink
        self.limiter = None if rate is None else AsyncLimiter(burst, burst / rate)

    @property
    def limit(self) -> int:
        """Creations allowed in flight now (at least 1, at most the ceiling)."""
        return max(1, min(self._ceiling, int(self._limit)))

    @property
    def latency(self) -> float | None:
        """The recent typical create time (median of the window, or the last one before it was
        emptied by a shrink), None before the first create."""
        if self._samples:
            self._last_latency = statistics.median(self._samples)
        return self._last_latency

    def set_ceiling(self, ceiling: int) -> None:
        """The pool's ``max_size`` changed (resize)."""
        self._ceiling = max(1, ceiling)

    async def ticket(self) -> None:
        """Wait for the rate limit (if any) before one create attempt. A cancelled wait takes nothing."""
        if self.limiter is not None:
            await self.limiter.acquire()

    def succeeded(self, started: float, seconds: float, *, limited: bool) -> None:
        """A create that started at loop time ``started`` took ``seconds``.

        ``limited``: whether the cap was what held creation back when it started (only then
        is a good latency evidence that a higher cap would be used).
        """
        if self._fixed is not None or started <= self._decreased_at:
            return  # started before the last shrink: it measured the old limit
        self._samples.append(seconds)
        latency = statistics.median(self._samples)
        baseline = self._baseline
        if baseline is None:
            if len(self._samples) >= self.DECIDE_AFTER:
                self._baseline = latency
        elif len(self._samples) >= self.DECIDE_AFTER:
            if latency < baseline:
                self._baseline = baseline + (latency - baseline) * self.BASELINE_FOLLOW
            else:
                self._baseline = baseline * (1 + self.BASELINE_DRIFT)
            if latency > self._tolerance * baseline:
                self._shrink(started, self.DECREASE)
                return
            if latency > (1 + (self._tolerance - 1) * self.SLOW_START_EXIT) * baseline:
                self._slow_start = False  # latency is rising: grow by one per round from here
        if limited:
            self._limit = min(float(self._ceiling), self._limit + (1.0 if self._slow_start else 1.0 / self._limit))

    def failed(self, started: float) -> None:
        """A create attempt that started at ``started`` failed."""
        if self._fixed is None:
            self._shrink(started, self.FAILURE_DECREASE)

    def _shrink(self, started: float, factor: float) -> None:
        if started <= self._decreased_at:
            return  # started before the last shrink: it measured the old limit
        self._slow_start = False
        self._limit = max(1.0, self._limit * factor)
        self._decreased_at = anyio.current_time()
        self._last_latency = self.latency
        self._samples.clear()
