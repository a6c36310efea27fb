"""Metrics aggregator fed by Session, Sandbox, SandboxPool and the gatherer.

Events land in the current *window* (everything since the last reset): counters,
``QuantileSketch``s (p50/p95/p99 within 1% relative error, bounded memory) and a
``sandbox_id -> exec count`` map that holds only sandboxes still alive (a
destroyed sandbox's count is folded into count/sum/min/max; an exec that ends
after its sandbox was destroyed stays in the map until the next reset). Gauges
(pool sizes, live sandboxes) are state, not per-window.

``sandbox_seconds`` (a cost proxy) is the time each sandbox existed within the
window, from its create request (startup included) to its destroy, or to the
snapshot for those still alive; each second is counted in exactly one window.

Thread-safe: every event and every snapshot takes one ``threading.Lock``, so
``Session.log_metrics`` may run on another thread (the TRL bridge) while the loop
records events. ``exec_finished`` costs about half a microsecond
(``benchmarks/bench_metrics.py``). ``take()`` swaps the window out atomically; a
reporter that fails hands it back with ``restore()``, so a failed flush never
loses data.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from types import MappingProxyType

from .._types import ExecOutcome
from ._histogram import QuantileSketch
from ._snapshot import Distribution, MetricsSnapshot, Summary

__all__ = ["MetricsAggregator"]

#: Distinct retry/gather labels kept per window; more are counted as "other".
MAX_LABELS = 32

_OK = ExecOutcome.COMPLETED_OK
_NONZERO = ExecOutcome.COMPLETED_NONZERO
_QUANTILES = (0.5, 0.95, 0.99)


#: The window's plain sums (merging two windows adds them).
_SUMS = (
    "created",
    "create_failures",
    "create_infra",
    "destroyed",
    "executions",
    "ok",
    "nonzero",
    "failures",
    "timeouts",
    "starved",
    "oom",
    "infra",
    "exec_cpu",
    "sandbox_seconds",
    "folded_sandboxes",
    "folded_execs",
    "swept",
    "leases",
    "warm_hits",
)


class _Window:
    """Everything counted since the last reset. Mutated only under the aggregator's lock."""

    __slots__ = (
        "accrue_from",
        "create_failures",
        "create_infra",
        "created",
        "destroyed",
        "exec_cpu",
        "exec_hist",
        "executions",
        "failures",
        "folded_execs",
        "folded_max",
        "folded_min",
        "folded_sandboxes",
        "gather",
        "infra",
        "judge",
        "lease_hist",
        "leases",
        "nonzero",
        "ok",
        "oom",
        "per_sandbox",
        "retries",
        "sandbox_seconds",
        "started",
        "startup_hist",
        "starved",
        "swept",
        "timeouts",
        "warm_hits",
    )

    def __init__(self, started: float) -> None:
        self.started = started  # for window_seconds
        self.accrue_from = started  # live sandboxes accrue sandbox-seconds from here
        self.created = self.create_failures = self.create_infra = self.destroyed = 0
        self.executions = self.ok = self.nonzero = self.failures = self.timeouts = self.infra = 0
        self.starved = self.oom = 0
        self.exec_cpu = self.sandbox_seconds = 0.0
        self.startup_hist = QuantileSketch()
        self.exec_hist = QuantileSketch()
        self.lease_hist = QuantileSketch()
        self.per_sandbox: dict[str, int] = {}  # live sandboxes only
        self.folded_sandboxes = self.folded_execs = 0  # destroyed sandboxes with execs in this window
        self.folded_min = math.inf
        self.folded_max = -math.inf
        self.retries: dict[str, int] = {}
        self.gather: dict[str, int] = {}
        self.judge: dict[str, int] = {}  # the judge's verdict counts
        self.swept = self.leases = self.warm_hits = 0

    def fold(self, count: int) -> None:
        self.folded_sandboxes += 1
        self.folded_execs += count
        self.folded_min = min(self.folded_min, count)
        self.folded_max = max(self.folded_max, count)

    def merge(self, old: _Window) -> None:
        """Add an older window's counts into this one, which now starts when ``old`` did.

        (A sandbox alive in ``old`` and destroyed since counts as two sandboxes in
        ``execs_per_sandbox``; this only happens after a failed delivery.)
        """
        self.started = min(self.started, old.started)
        for name in _SUMS:
            setattr(self, name, getattr(self, name) + getattr(old, name))
        self.startup_hist.merge(old.startup_hist)
        self.exec_hist.merge(old.exec_hist)
        self.lease_hist.merge(old.lease_hist)
        for sid, n in old.per_sandbox.items():
            self.per_sandbox[sid] = self.per_sandbox.get(sid, 0) + n
        self.folded_min = min(self.folded_min, old.folded_min)
        self.folded_max = max(self.folded_max, old.folded_max)
        for key, n in old.retries.items():
            _bump(self.retries, key, n)
        for key, n in old.gather.items():
            _bump(self.gather, key, n)
        for key, n in old.judge.items():
            _bump(self.judge, key, n)


def _bump(labels: dict[str, int], key: str, n: int = 1) -> None:
    if key not in labels and len(labels) >= MAX_LABELS:
        key = "other"
    labels[key] = labels.get(key, 0) + n


def _distribution(h: QuantileSketch) -> Distribution | None:
    if h.count == 0:
        return None
    p50, p95, p99 = h.quantiles(_QUANTILES)
    return Distribution(h.count, h.total, h.min, h.max, p50, p95, p99, h.relative_error)


class MetricsAggregator:
    """Thread-safe counters, gauges and histograms for one Session.

    Event methods never raise and never block beyond a short lock. ``clock`` is
    ``time.monotonic`` unless a test injects another.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._window = _Window(clock())
        self._alive: dict[str, float] = {}  # sandbox_id -> when its create was requested
        self._pools: dict[str, tuple[int, int, int]] = {}

    # -- events ---------------------------------------------------------------
    def sandbox_created(self, sandbox_id: str, startup_seconds: float) -> None:
        """A sandbox became ready ``startup_seconds`` after its create request."""
        now = self._clock()
        with self._lock:
            w = self._window
            w.created += 1
            w.startup_hist.add(startup_seconds)
            self._alive[sandbox_id] = now - startup_seconds

    def sandbox_create_failed(self, error: BaseException) -> None:
        """A create request failed (it still counts in ``sandboxes_created``, as in the CoreWeave SDK).

        It counts as an infrastructure failure only if the error says so: an exception
        outside the ``SandboxError`` tree is a bug, not the platform's failure.
        """
        infra = bool(getattr(error, "infrastructure", False))
        with self._lock:
            self._window.create_failures += 1
            if infra:
                self._window.create_infra += 1

    def sandbox_destroyed(self, sandbox_id: str, lifetime_seconds: float) -> None:
        """A sandbox was stopped; its time alive within this window adds to ``sandbox_seconds``."""
        now = self._clock()
        with self._lock:
            w = self._window
            w.destroyed += 1
            start = self._alive.pop(sandbox_id, now - lifetime_seconds)
            w.sandbox_seconds += max(0.0, now - max(start, w.accrue_from))
            count = w.per_sandbox.pop(sandbox_id, 0)
            if count:
                w.fold(count)

    def exec_finished(
        self,
        sandbox_id: str,
        outcome: ExecOutcome,
        wall_seconds: float,
        cpu_seconds: float,
        *,
        timed_out: bool = False,
        infrastructure: bool = False,
        starved: bool = False,
        oom_killed: bool = False,
    ) -> None:
        """One exec ended. A timeout or infrastructure error is also a ``FAILURE`` outcome.

        ``starved``: a timeout that fired while the command was starved of CPU (also a
        timeout and an infrastructure failure); ``oom_killed``: the kernel killed the
        command for its memory (any outcome).
        """
        with self._lock:
            w = self._window
            w.executions += 1
            if oom_killed:
                w.oom += 1
            if outcome is _OK:
                w.ok += 1
            elif outcome is _NONZERO:
                w.nonzero += 1
            else:
                w.failures += 1
                if timed_out:
                    w.timeouts += 1
                    if starved:
                        w.starved += 1
                if infrastructure:
                    w.infra += 1
            w.exec_cpu += cpu_seconds
            w.exec_hist.add(wall_seconds)
            per = w.per_sandbox
            per[sandbox_id] = per.get(sandbox_id, 0) + 1

    def retry(self, what: str) -> None:
        """An operation (``what``: "create", "exec", ...) is being retried."""
        with self._lock:
            _bump(self._window.retries, what)

    def swept(self, count: int) -> None:
        """A sweep stopped ``count`` sandboxes left by other (possibly crashed) processes."""
        with self._lock:
            self._window.swept += count

    def lease(self, wait_seconds: float, *, warm: bool) -> None:
        """A pool handed out a sandbox after ``wait_seconds``; ``warm`` if it was already ready."""
        with self._lock:
            w = self._window
            w.leases += 1
            if warm:
                w.warm_hits += 1
            w.lease_hist.add(wait_seconds)

    def pool_gauges(self, *, idle: int, leased: int, warming: int, pool_id: str = "") -> None:
        """A pool's current sizes. Several pools should pass distinct ``pool_id``s; they are summed."""
        with self._lock:
            self._pools[pool_id] = (idle, leased, warming)

    def pool_closed(self, pool_id: str = "") -> None:
        """Forget a closed pool's gauges."""
        with self._lock:
            self._pools.pop(pool_id, None)

    def gather_outcome(self, kind: str, duration: float) -> None:
        """A gatherer task finished as ``kind`` ("ok", "error", "timeout", "cancelled", ...)."""
        with self._lock:
            _bump(self._window.gather, kind)

    def judge_verdict(self, kind: str, count: int = 1) -> None:
        """The judge decided ``count`` test cases as ``kind`` (a verdict), or counted ``completions``."""
        with self._lock:
            _bump(self._window.judge, kind, count)

    # -- reading --------------------------------------------------------------
    def snapshot(self, *, reset: bool = False) -> MetricsSnapshot:
        """A frozen view of the current window; with ``reset`` a new window starts now."""
        return self.take(reset=reset)[0]

    def take(self, *, reset: bool) -> tuple[MetricsSnapshot, _Window | None]:
        """Snapshot (and with ``reset``, swap out) the window atomically.

        Returns the swapped-out window so a failed delivery can ``restore()`` it.
        """
        with self._lock:
            now = self._clock()
            w = self._window
            alive = self._alive_seconds(w, now)
            snap = self._build(w, now, alive)
            if not reset:
                return snap, None
            w.sandbox_seconds += alive  # live sandboxes' time up to now belongs to the old window
            self._window = _Window(now)
            return snap, w

    def restore(self, old: _Window) -> None:
        """Merge a window taken by ``take(reset=True)`` back in (its data was not delivered)."""
        with self._lock:
            self._window.merge(old)

    def _alive_seconds(self, w: _Window, now: float) -> float:
        return sum(max(0.0, now - max(start, w.accrue_from)) for start in self._alive.values())

    def _build(self, w: _Window, now: float, alive_seconds: float) -> MetricsSnapshot:
        counts = w.per_sandbox.values()
        per: Summary | None = None
        if w.folded_sandboxes or counts:
            per = Summary(
                w.folded_sandboxes + len(counts),
                float(w.folded_execs + sum(counts)),
                float(min(w.folded_min, *counts)) if counts else w.folded_min,
                float(max(w.folded_max, *counts)) if counts else w.folded_max,
            )
        pools = self._pools.values()
        return MetricsSnapshot(
            window_seconds=now - w.started,
            sandboxes_created=w.created + w.create_failures,
            create_failures=w.create_failures,
            sandboxes_destroyed=w.destroyed,
            sandboxes_live=len(self._alive),
            executions=w.executions,
            exec_completed_ok=w.ok,
            exec_completed_nonzero=w.nonzero,
            exec_failures=w.failures,
            exec_timeouts=w.timeouts,
            exec_infra_failures=w.infra,
            exec_starved=w.starved,
            exec_oom_killed=w.oom,
            create_infra_failures=w.create_infra,
            exec_cpu_seconds=w.exec_cpu,
            sandbox_seconds=w.sandbox_seconds + alive_seconds,
            startup=_distribution(w.startup_hist),
            exec_seconds=_distribution(w.exec_hist),
            lease_wait=_distribution(w.lease_hist),
            execs_per_sandbox=per,
            retries=MappingProxyType(dict(w.retries)),
            orphans_swept=w.swept,
            leases=w.leases,
            warm_hits=w.warm_hits,
            pools=len(self._pools),
            pool_idle=sum(p[0] for p in pools),
            pool_leased=sum(p[1] for p in pools),
            pool_warming=sum(p[2] for p in pools),
            gather=MappingProxyType(dict(w.gather)),
            judge=MappingProxyType(dict(w.judge)),
        )
