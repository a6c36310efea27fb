"""Frozen metric snapshots: what reporters (W&B, the structured log) and users read.

``MetricsSnapshot.as_dict()`` is the flat ``cwsandbox/...`` mapping logged to W&B.
The first 14 names and their definitions are the CoreWeave SDK's (so existing
dashboards keep working), emitted under the same conditions:

==============================  ===========================================================
``sandboxes_created``           sandboxes requested (started or failed to start)
``executions``                  execs that ended (ok, non-zero or failure)
``exec_completed_ok``           returncode 0
``exec_completed_nonzero``      returncode != 0 (a result, not a failure)
``exec_failures``               timeout, cancellation, transport, dead sandbox, ``check=True``
``exec_completion_rate``        ok / executions (only if executions > 0)
``exec_failure_rate``           failures / executions (only if executions > 0)
``startup_count``               sandboxes that became ready (only if > 0, as the next three)
``avg/min/max_startup_seconds`` request to ready
``avg/min/max_execs_per_sandbox`` over sandboxes that ran at least one exec in the window
                                (counted always, not only while a W&B run is attached)
==============================  ===========================================================

Everything else is added under the same prefix: percentiles (``*_p50/_p95/_p99``,
within the histogram's relative error, 1% by default), timeouts (``exec_starved``:
of them, those that fired while the command was starved of CPU), OOM kills
(``exec_oom_killed``), infrastructure failures, retries, destroyed/live/swept
sandboxes, pool gauges and warm-hit rate, exec CPU seconds, sandbox-seconds,
gatherer outcome counts and the judge's verdict counts (``judge_<verdict>`` per test case,
``judge_completions`` and ``judge_completion_<verdict>`` per judged completion).

``as_dict(namespace="x")`` puts every name under ``cwsandbox/x/`` (one namespace
per TRL reward function, so two of them never write the same keys). A snapshot
with ``teardown=True`` (the close flush of a window that did no step's work:
nothing ran or was leased; sandboxes were stopped, or warmed by a pool refilling
after the last step) maps to the few ``cwsandbox/[x/]teardown/*`` names that
describe it, so a step's charts never get a row of zeros after the last step.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from .._errors import SandboxValidationError

__all__ = ["PREFIX", "TEARDOWN", "Distribution", "MetricsSnapshot", "Summary", "validate_namespace"]

PREFIX = "cwsandbox/"
#: The section a teardown-only close flush is logged under (``cwsandbox/[<namespace>/]teardown/``).
TEARDOWN = "teardown/"
_TEARDOWN_NAMES = frozenset(
    {
        "sandboxes_created",
        "create_failures",
        "sandboxes_destroyed",
        "sandboxes_live",
        "sandbox_seconds",
        "orphans_swept",
        "window_seconds",
    }
)
_UNSAFE = re.compile(r"[^a-z0-9_]+")
_NAMESPACE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")


def validate_namespace(namespace: object) -> str | None:
    """A metrics namespace: None, or 1-64 letters, digits and ``_.-`` (no slash). ``SandboxValidationError`` else."""
    if namespace is None:
        return None
    if not isinstance(namespace, str) or not _NAMESPACE.match(namespace):
        raise SandboxValidationError(
            f"metrics namespace must be 1-64 letters, digits or _.- (no slash), got {namespace!r}"
        )
    return namespace


def _label(name: object) -> str:
    text = str(getattr(name, "value", name))  # an Enum member by its value
    return _UNSAFE.sub("_", text.lower()).strip("_") or "other"


@dataclass(frozen=True, slots=True)
class Summary:
    """Count, total, min and max of some values (exact)."""

    count: int
    total: float
    min: float
    max: float

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0


@dataclass(frozen=True, slots=True)
class Distribution(Summary):
    """A ``Summary`` plus p50/p95/p99 from the streaming histogram (relative error in ``relative_error``)."""

    p50: float
    p95: float
    p99: float
    relative_error: float


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """Everything measured in one window (since the last reset), frozen at ``taken_at``.

    ``None`` distributions mean nothing was measured. Gauges (``sandboxes_live``,
    ``pool_*``) are the state at ``taken_at``, not sums over the window.
    """

    window_seconds: float
    sandboxes_created: int
    create_failures: int
    sandboxes_destroyed: int
    sandboxes_live: int
    executions: int
    exec_completed_ok: int
    exec_completed_nonzero: int
    exec_failures: int
    exec_timeouts: int
    exec_infra_failures: int
    #: Of ``exec_timeouts``: those that fired while the command was starved of CPU (also infrastructure).
    exec_starved: int
    #: Execs the kernel killed for their memory (a result: the program's own outcome).
    exec_oom_killed: int
    create_infra_failures: int
    exec_cpu_seconds: float
    sandbox_seconds: float
    startup: Distribution | None
    exec_seconds: Distribution | None
    lease_wait: Distribution | None
    execs_per_sandbox: Summary | None
    retries: Mapping[str, int]
    orphans_swept: int
    leases: int
    warm_hits: int
    pools: int
    pool_idle: int
    pool_leased: int
    pool_warming: int
    gather: Mapping[str, int]
    #: Set on the close flush's copy when the window only stopped sandboxes (see ``only_teardown``).
    teardown: bool = False
    #: The judge's counts: test cases per verdict, and ``completions`` / ``completion_<verdict>``.
    judge: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))

    # -- derived ---------------------------------------------------------------
    @property
    def startup_count(self) -> int:
        return self.startup.count if self.startup is not None else 0

    @property
    def exec_completion_rate(self) -> float | None:
        return self.exec_completed_ok / self.executions if self.executions else None

    @property
    def exec_failure_rate(self) -> float | None:
        return self.exec_failures / self.executions if self.executions else None

    @property
    def infra_failure_rate(self) -> float | None:
        """Creates and execs that failed through the platform's fault, over all creates and execs."""
        attempts = self.sandboxes_created + self.executions
        return (self.create_infra_failures + self.exec_infra_failures) / attempts if attempts else None

    @property
    def warm_hit_rate(self) -> float | None:
        return self.warm_hits / self.leases if self.leases else None

    @property
    def total_retries(self) -> int:
        return sum(self.retries.values())

    @property
    def has_activity(self) -> bool:
        """Whether anything happened in the window (an idle window is not logged)."""
        return bool(
            self.sandboxes_created
            or self.sandboxes_destroyed
            or self.executions
            or self.leases
            or self.orphans_swept
            or self.retries
            or self.gather
            or self.judge
        )

    @property
    def only_teardown(self) -> bool:
        """Something happened, but no step's work: nothing ran or was leased, sandboxes were only
        stopped, swept or warmed (a pool refilling after the last step, then closing)."""
        return self.has_activity and not (self.executions or self.leases or self.gather)

    # -- flat mapping ----------------------------------------------------------
    def as_dict(self, namespace: str | None = None) -> dict[str, int | float]:
        """The flat ``cwsandbox/[<namespace>/]<name>`` mapping reporters log (no NaN; absent means not measured).

        With ``teardown`` set, only the teardown names, under ``.../teardown/``.
        """
        prefix = PREFIX + (f"{validate_namespace(namespace)}/" if namespace else "")
        m = self._flat()
        if self.teardown:
            return {prefix + TEARDOWN + k: v for k, v in m.items() if k in _TEARDOWN_NAMES or k.startswith("retries")}
        return {prefix + k: v for k, v in m.items()}

    def _flat(self) -> dict[str, int | float]:
        m: dict[str, int | float] = {
            "sandboxes_created": self.sandboxes_created,
            "executions": self.executions,
            "exec_completed_ok": self.exec_completed_ok,
            "exec_completed_nonzero": self.exec_completed_nonzero,
            "exec_failures": self.exec_failures,
        }
        if self.executions:
            m["exec_completion_rate"] = self.exec_completed_ok / self.executions
            m["exec_failure_rate"] = self.exec_failures / self.executions
        if self.startup is not None:
            m["startup_count"] = self.startup.count
            m["avg_startup_seconds"] = self.startup.mean
            m["min_startup_seconds"] = self.startup.min
            m["max_startup_seconds"] = self.startup.max
        if self.execs_per_sandbox is not None:
            m["avg_execs_per_sandbox"] = self.execs_per_sandbox.mean
            m["min_execs_per_sandbox"] = int(self.execs_per_sandbox.min)
            m["max_execs_per_sandbox"] = int(self.execs_per_sandbox.max)
        # -- beyond the CoreWeave names ----------------------------------------
        m["create_failures"] = self.create_failures
        m["sandboxes_destroyed"] = self.sandboxes_destroyed
        m["sandboxes_live"] = self.sandboxes_live
        m["exec_timeouts"] = self.exec_timeouts
        m["exec_infra_failures"] = self.exec_infra_failures
        m["exec_starved"] = self.exec_starved
        m["exec_oom_killed"] = self.exec_oom_killed
        rate = self.infra_failure_rate
        if rate is not None:
            m["infra_failure_rate"] = rate
        m["exec_cpu_seconds"] = self.exec_cpu_seconds
        m["sandbox_seconds"] = self.sandbox_seconds
        m["window_seconds"] = self.window_seconds
        _percentiles(m, "startup_seconds", self.startup)
        _percentiles(m, "exec_seconds", self.exec_seconds)
        if self.exec_seconds is not None:
            m["avg_exec_seconds"] = self.exec_seconds.mean
            m["max_exec_seconds"] = self.exec_seconds.max
        m["retries"] = self.total_retries
        for what, n in self.retries.items():
            m[f"retries_{_label(what)}"] = m.get(f"retries_{_label(what)}", 0) + n
        m["orphans_swept"] = self.orphans_swept
        m["leases"] = self.leases
        if self.leases:
            m["warm_hits"] = self.warm_hits
            m["warm_hit_rate"] = self.warm_hits / self.leases
        _percentiles(m, "lease_wait_seconds", self.lease_wait)
        if self.lease_wait is not None:
            m["max_lease_wait_seconds"] = self.lease_wait.max
        if self.pools:
            m["pool_idle"] = self.pool_idle
            m["pool_leased"] = self.pool_leased
            m["pool_warming"] = self.pool_warming
        for kind, n in self.gather.items():
            m[f"gather_{_label(kind)}"] = m.get(f"gather_{_label(kind)}", 0) + n
        for kind, n in self.judge.items():
            m[f"judge_{_label(kind)}"] = m.get(f"judge_{_label(kind)}", 0) + n
        return m


def _percentiles(m: dict[str, int | float], name: str, d: Distribution | None) -> None:
    if d is not None:
        m[f"{name}_p50"] = d.p50
        m[f"{name}_p95"] = d.p95
        m[f"{name}_p99"] = d.p99
