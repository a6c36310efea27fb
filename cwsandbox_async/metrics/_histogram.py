"""A compact streaming histogram with a guaranteed relative error on quantiles.

Log-bucketed, as in DDSketch (Masson et al., VLDB 2019): a positive value ``x``
goes to bucket ``ceil(log(x) / log(gamma))`` with ``gamma = (1 + a) / (1 - a)``;
a bucket is reported as ``2 * gamma**i / (gamma + 1)``, which is within relative
error ``a`` of every value in it. So ``quantile(q)`` is within ``a`` (default 1%)
of the exact nearest-rank sample quantile ``sorted(values)[max(0, ceil(q * n) - 1)]``
(so p99 of 10 values is the largest), clamped to the exact ``min``/``max``.

Memory is bounded whatever the stream: values are clamped to
``[MIN_TRACKED, MAX_TRACKED]`` (1 ns .. ~11.6 days for seconds), so there are at
most ``ceil(log(MAX/MIN) / log(gamma))`` buckets, about 1,730 at 1%. Values at or
below ``MIN_TRACKED`` (including 0 and negatives) are counted in a zero bucket.
``count``, ``total``, ``min`` and ``max`` are exact. Not thread-safe: the
metrics aggregator holds its lock around every call.
"""

from __future__ import annotations

import math

__all__ = ["DEFAULT_RELATIVE_ERROR", "LogHistogram"]

DEFAULT_RELATIVE_ERROR = 0.01
MIN_TRACKED = 1e-9
MAX_TRACKED = 1e6
_ceil = math.ceil
_log = math.log


class LogHistogram:
    """Streaming quantiles over positive values (durations in seconds, counts)."""

    __slots__ = (
        "_buckets",
        "_gamma",
        "_inv_log_gamma",
        "_max_index",
        "_min_index",
        "count",
        "max",
        "min",
        "total",
        "zeros",
    )

    def __init__(self, relative_error: float = DEFAULT_RELATIVE_ERROR) -> None:
        if not 0.0 < relative_error < 1.0:
            raise ValueError("relative_error must be in (0, 1)")
        self._gamma = (1.0 + relative_error) / (1.0 - relative_error)
        self._inv_log_gamma = 1.0 / math.log(self._gamma)
        self._min_index = math.ceil(math.log(MIN_TRACKED) * self._inv_log_gamma)
        self._max_index = math.ceil(math.log(MAX_TRACKED) * self._inv_log_gamma)
        self._buckets: dict[int, int] = {}
        self.count = 0
        self.zeros = 0
        self.total = 0.0
        self.min = math.inf
        self.max = -math.inf

    @property
    def relative_error(self) -> float:
        return (self._gamma - 1.0) / (self._gamma + 1.0)

    @property
    def max_buckets(self) -> int:
        """The most buckets this histogram can ever hold (its memory bound)."""
        return self._max_index - self._min_index + 1

    def add(self, value: float) -> None:
        """Record one value. NaN is ignored; values above ``MAX_TRACKED`` share the top bucket."""
        if value != value:  # NaN
            return
        self.count += 1
        self.total += value
        if value < self.min:
            self.min = value
        if value > self.max:
            self.max = value
        if value <= MIN_TRACKED:
            self.zeros += 1
            return
        if value > MAX_TRACKED:
            value = MAX_TRACKED
        i = _ceil(_log(value) * self._inv_log_gamma)
        b = self._buckets
        b[i] = b.get(i, 0) + 1

    def merge(self, other: LogHistogram) -> None:
        """Add ``other``'s values into this one (same relative error assumed)."""
        for i, c in other._buckets.items():
            self._buckets[i] = self._buckets.get(i, 0) + c
        self.count += other.count
        self.zeros += other.zeros
        self.total += other.total
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)

    def copy(self) -> LogHistogram:
        h = LogHistogram.__new__(LogHistogram)
        h._gamma, h._inv_log_gamma = self._gamma, self._inv_log_gamma
        h._min_index, h._max_index = self._min_index, self._max_index
        h._buckets = dict(self._buckets)
        h.count, h.zeros, h.total, h.min, h.max = self.count, self.zeros, self.total, self.min, self.max
        return h

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else math.nan

    def quantiles(self, qs: tuple[float, ...]) -> tuple[float, ...]:
        """Estimates for each ``q`` in ``[0, 1]`` (ascending), one pass over the sorted buckets.

        NaN for an empty histogram. Raises ``ValueError`` for a ``q`` outside [0, 1].
        """
        if any(not 0.0 <= q <= 1.0 for q in qs):
            raise ValueError("quantiles must be within [0, 1]")
        if self.count == 0:
            return tuple(math.nan for _ in qs)
        order = sorted(range(len(qs)), key=qs.__getitem__)
        ranks = [max(0, math.ceil(qs[j] * self.count) - 1) for j in order]  # nearest rank, ascending
        found: list[float] = []
        seen = self.zeros
        zero = min(max(0.0, self.min), self.max)
        while len(found) < len(ranks) and ranks[len(found)] < seen:
            found.append(zero)
        for i in sorted(self._buckets):
            if len(found) == len(ranks):
                break
            seen += self._buckets[i]
            estimate = min(max(2.0 * self._gamma**i / (self._gamma + 1.0), self.min), self.max)
            while len(found) < len(ranks) and ranks[len(found)] < seen:
                found.append(estimate)
        found.extend([self.max] * (len(ranks) - len(found)))
        result = [0.0] * len(qs)
        for j, value in zip(order, found, strict=True):
            # the extreme ranks are known exactly
            result[j] = self.min if qs[j] == 0.0 else self.max if qs[j] == 1.0 else value
        return tuple(result)

    def quantile(self, q: float) -> float:
        return self.quantiles((q,))[0]

    def __len__(self) -> int:
        return self.count
