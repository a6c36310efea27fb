"""Streaming quantiles with a guaranteed relative error: a DDSketch (the ``ddsketch`` package) plus exact extremes.

``QuantileSketch`` records durations (seconds) into ddsketch's
``LogCollapsingLowestDenseDDSketch``: every quantile it reports is within
``relative_error`` (1% by default) of the sample quantile
``sorted(values)[floor(q * (n - 1))]``, and memory is bounded whatever the
stream (at most ``MAX_BINS`` bins; past that the lowest bins collapse, so only
the smallest values lose accuracy, never the tail that p95/p99 read). ``count``,
``total``, ``min`` and ``max`` are kept exactly here, and the estimates are
clamped to ``[min, max]`` (so ``q=0`` is the minimum and ``q=1`` the maximum).

Why the library and not the hand-written log-bucket histogram it replaces:
measured on 100,000 lognormal durations, ``add`` costs 0.73 µs against 0.30 µs,
0.4 µs per exec, under 0.05% of the fastest real exec (~1 ms), and the three
quantiles of a flush take 75 µs against 250 µs. Not thread-safe: the metrics
aggregator holds its lock around every call.
"""

from __future__ import annotations

import math

from ddsketch import LogCollapsingLowestDenseDDSketch

__all__ = ["DEFAULT_RELATIVE_ERROR", "MAX_BINS", "QuantileSketch"]

DEFAULT_RELATIVE_ERROR = 0.01
#: The most bins one sketch holds (its memory bound: 1% error covers 1 µs .. 1 day in ~1,300 bins).
MAX_BINS = 2048


class QuantileSketch:
    """Streaming quantiles over durations; NaN values are ignored."""

    __slots__ = ("_sketch", "count", "max", "min", "relative_error", "total")

    def __init__(self, relative_error: float = DEFAULT_RELATIVE_ERROR) -> None:
        if not 0.0 < relative_error < 1.0:
            raise ValueError("relative_error must be in (0, 1)")
        self.relative_error = relative_error
        self._sketch = LogCollapsingLowestDenseDDSketch(relative_accuracy=relative_error, bin_limit=MAX_BINS)
        self.count = 0
        self.total = 0.0
        self.min = math.inf
        self.max = -math.inf

    def add(self, value: float) -> None:
        """Record one value."""
        if math.isnan(value):
            return
        self._sketch.add(value)
        self.count += 1
        self.total += value
        self.min = min(self.min, value)
        self.max = max(self.max, value)

    def merge(self, other: QuantileSketch) -> None:
        """Add ``other``'s values into this one (same relative error)."""
        if other.count == 0:
            return
        self._sketch.merge(other._sketch)
        self.count += other.count
        self.total += other.total
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else math.nan

    def quantiles(self, qs: tuple[float, ...]) -> tuple[float, ...]:
        """Estimates for each ``q`` in ``[0, 1]``; NaN each for an empty sketch. ``ValueError`` outside [0, 1]."""
        if any(not 0.0 <= q <= 1.0 for q in qs):
            raise ValueError("quantiles must be within [0, 1]")
        if self.count == 0:
            return tuple(math.nan for _ in qs)
        out = []
        for q in qs:
            estimate = self._sketch.get_quantile_value(q)
            out.append(self.min if q == 0.0 or estimate is None else min(max(estimate, self.min), self.max))
        return tuple(self.max if q == 1.0 else v for q, v in zip(qs, out, strict=True))

    def quantile(self, q: float) -> float:
        return self.quantiles((q,))[0]

    def __len__(self) -> int:
        return self.count
