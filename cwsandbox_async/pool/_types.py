"""The pool's lifecycle enum and its statistics snapshot."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .._errors import PoolClosedError, PoolError

__all__ = ["PoolState", "PoolStatistics", "check_transition"]


class PoolState(enum.Enum):
    """Lifecycle of a ``SandboxPool``: NEW -> OPEN -> CLOSING -> CLOSED (or NEW -> CLOSED)."""

    NEW = "new"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


_ALLOWED: dict[PoolState, frozenset[PoolState]] = {
    PoolState.NEW: frozenset({PoolState.OPEN, PoolState.CLOSED}),
    PoolState.OPEN: frozenset({PoolState.CLOSING}),
    PoolState.CLOSING: frozenset({PoolState.CLOSED}),
    PoolState.CLOSED: frozenset(),
}


def check_transition(current: PoolState, target: PoolState) -> None:
    """Raise ``PoolClosedError`` (closed pools) or ``PoolError`` if ``current -> target`` is not allowed."""
    if target in _ALLOWED[current]:
        return
    if current in (PoolState.CLOSING, PoolState.CLOSED):
        raise PoolClosedError(f"the pool is {current.value}; a pool cannot be reopened")
    raise PoolError(f"a pool cannot go from {current.value} to {target.value}")


@dataclass(frozen=True, slots=True)
class PoolStatistics:
    """A snapshot of a ``SandboxPool`` (``pool.statistics()``).

    Gauges (now): ``idle`` warm sandboxes ready to lease; ``leased`` sandboxes held by
    leases (including ones being health-checked or reset); ``warming`` creations in
    flight (including their retry back-off); ``waiting`` leases queued for a sandbox;
    ``destroying`` sandboxes being stopped. ``alive`` is their sum without ``waiting``:
    what counts against ``max_size``.

    Counters (since the pool opened): ``created``/``destroyed`` sandboxes;
    ``failures`` failed create attempts and ``retries`` of them; ``warm_hits`` leases
    served at once from the idle set and ``cold_waits`` leases that had to wait;
    ``timeouts`` leases that gave up at their deadline; ``discarded`` sandboxes thrown
    away because they were found dead or their reset failed; ``max_alive`` the highest
    ``alive`` seen (never above ``max_size``).
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

    @property
    def alive(self) -> int:
        """Sandboxes alive or being created or stopped: what ``max_size`` caps."""
        return self.idle + self.leased + self.warming + self.destroying
