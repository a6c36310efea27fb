"""Metrics aggregator fed by Session, Sandbox, SandboxPool and the gatherer.

(Skeleton: the event methods are the interface the other layers call; the metrics
issue fills in histograms, snapshots and reporters.)
"""

from __future__ import annotations

import threading
from collections import Counter

from ._types import ExecOutcome

__all__ = ["MetricsAggregator"]


class MetricsAggregator:
    """Thread-safe counters, gauges and histograms for one Session."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counters: Counter[str] = Counter()

    # -- events ---------------------------------------------------------------
    def sandbox_created(self, sandbox_id: str, startup_seconds: float) -> None:
        with self._lock:
            self.counters["sandboxes_created"] += 1

    def sandbox_create_failed(self, error: BaseException) -> None:
        with self._lock:
            self.counters["create_failures"] += 1

    def sandbox_destroyed(self, sandbox_id: str, lifetime_seconds: float) -> None:
        with self._lock:
            self.counters["sandboxes_destroyed"] += 1

    def exec_finished(
        self,
        sandbox_id: str,
        outcome: ExecOutcome,
        wall_seconds: float,
        cpu_seconds: float,
        *,
        timed_out: bool = False,
        infrastructure: bool = False,
    ) -> None:
        with self._lock:
            self.counters["executions"] += 1
            self.counters[f"exec_{outcome.value}"] += 1

    def retry(self, what: str) -> None:
        with self._lock:
            self.counters["retries"] += 1

    def swept(self, count: int) -> None:
        with self._lock:
            self.counters["orphans_swept"] += count

    def lease(self, wait_seconds: float, *, warm: bool) -> None:
        with self._lock:
            self.counters["leases"] += 1

    def pool_gauges(self, *, idle: int, leased: int, warming: int) -> None:
        pass

    def gather_outcome(self, kind: str, duration: float) -> None:
        pass
