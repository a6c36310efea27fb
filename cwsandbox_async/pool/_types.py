"""The pool's lifecycle enum and its statistics snapshot."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .._errors import PoolClosedError, PoolError
from .._log import log

__all__ = ["Lifecycle", "PoolState", "PoolStatistics", "check_transition"]


class PoolState(enum.Enum):
    """Lifecycle of a ``SandboxPool``: NEW -> OPEN -> CLOSING -> CLOSED (or NEW -> CLOSED).

    ``FAILED``: the pool's background work hit a bug (an unexpected exception); every
    waiting and later lease raises ``PoolError`` chained to it, and ``statistics().failure``
    holds it. A failed pool still closes (FAILED -> CLOSING -> CLOSED) and destroys
    everything it created.
    """

    NEW = "new"
    OPEN = "open"
    FAILED = "failed"
    CLOSING = "closing"
    CLOSED = "closed"


_ALLOWED: dict[PoolState, frozenset[PoolState]] = {
    PoolState.NEW: frozenset({PoolState.OPEN, PoolState.CLOSED}),
    PoolState.OPEN: frozenset({PoolState.FAILED, PoolState.CLOSING}),
    PoolState.FAILED: frozenset({PoolState.CLOSING}),
    PoolState.CLOSING: frozenset({PoolState.CLOSED}),
    PoolState.CLOSED: frozenset(),
}


def check_transition(current: PoolState, target: PoolState) -> None:
    """Raise ``PoolClosedError`` (closed pools) or ``PoolError`` if ``current -> target`` is not allowed.

    Both are the caller's mistake (``infrastructure=False``).
    """
    if target in _ALLOWED[current]:
        return
    if current in (PoolState.CLOSING, PoolState.CLOSED):
        raise PoolClosedError(f"the pool is {current.value}; a pool cannot be reopened", infrastructure=False)
    raise PoolError(f"a pool cannot go from {current.value} to {target.value}", infrastructure=False)


class Lifecycle:
    """A pool's state, its guarded transitions, and the error a request gets when the pool does not serve."""

    def __init__(self, pool_id: str) -> None:
        self.pool_id = pool_id
        self.state = PoolState.NEW
        self.failure: BaseException | None = None

    @property
    def is_open(self) -> bool:
        return self.state is PoolState.OPEN

    def to(self, target: PoolState) -> None:
        """Move to ``target``; raises as ``check_transition`` does if that is not allowed."""
        check_transition(self.state, target)
        log.debug("pool state", pool_id=self.pool_id, old=self.state.value, new=target.value)
        self.state = target

    def fail(self, exc: BaseException) -> None:
        """Background work failed with ``exc`` (a bug): an open pool moves to FAILED."""
        self.failure = exc
        if self.state is PoolState.OPEN:
            self.to(PoolState.FAILED)

    def failed_error(self) -> PoolError:
        """A fresh error for one request to a failed pool, chained to the failure."""
        err = PoolError(f"the pool failed: {self.failure!r}", infrastructure=False)
        err.__cause__ = self.failure
        return err

    def check_open(self) -> None:
        """Raise the error a lease (or ``wait_ready``/``resize``) gets from a pool that does not serve."""
        if self.state is PoolState.OPEN:
            return
        if self.state is PoolState.NEW:
            raise PoolError("the pool is not open; use 'async with SandboxPool(...)'", infrastructure=False)
        if self.state is PoolState.FAILED:
            raise self.failed_error()
        raise PoolClosedError("cannot lease from a closed pool", infrastructure=False)


@dataclass(frozen=True, slots=True)
class PoolStatistics:
    """A snapshot of a ``SandboxPool`` (``pool.statistics()``).

    Gauges (now): ``idle`` warm sandboxes ready to lease; ``leased`` sandboxes held by
    leases (including ones being health-checked or reset); ``warming`` creations in
    flight (including their retry back-off); ``waiting`` leases queued for a sandbox;
    ``destroying`` sandboxes being stopped. ``alive`` is their sum without ``waiting``:
    what counts against ``max_size``. ``create_limit`` is how many creations the pool
    lets run at once now (adaptive unless ``create_concurrency`` fixed it) and
    ``create_latency_seconds`` the recent typical create time it is paced by (None
    before the first creation).

    Counters (since the pool opened): ``created``/``destroyed`` sandboxes;
    ``failures`` failed create attempts and ``retries`` of them; ``warm_hits`` leases
    served at once from the idle set and ``cold_waits`` leases that had to wait
    (``warm_hit_rate`` is the share of the first); ``timeouts`` leases that gave up at
    their deadline; ``discarded`` sandboxes thrown away because they were found dead,
    their reset failed or their lifetime could not be set; ``max_alive`` the highest
    ``alive`` seen (never above ``max_size``).

    ``failure`` is the exception that moved the pool to ``FAILED``: the first one its
    background work raised (all of them are logged at ERROR); None otherwise.
    """

    state: PoolState
    size: int
    max_size: int
    idle: int
    leased: int
    warming: int
    waiting: int
    destroying: int
    created: int
    destroyed: int
    failures: int
    retries: int
    warm_hits: int
    cold_waits: int
    timeouts: int
    discarded: int
    max_alive: int
    create_limit: int = 0
    create_latency_seconds: float | None = None
    failure: BaseException | None = None

    @property
    def alive(self) -> int:
        """Sandboxes alive or being created or stopped: what ``max_size`` caps."""
        return self.idle + self.leased + self.warming + self.destroying

    @property
    def warm_hit_rate(self) -> float | None:
        """Share of leases served at once from the idle set (None before the first lease)."""
        leases = self.warm_hits + self.cold_waits
        return self.warm_hits / leases if leases else None
