"""Lease: the async context manager ``SandboxPool.lease()`` returns."""

from __future__ import annotations

import math
import time
from types import TracebackType
from typing import TYPE_CHECKING

import anyio

from ._errors import PoolClosedError, PoolError, SandboxTimeoutError

if TYPE_CHECKING:
    from ._pool import SandboxPool
    from ._sandbox import Sandbox

__all__ = ["Lease"]


class Lease:
    """``async with pool.lease() as sb``: a ready sandbox for the duration of the block.

    Entering waits for a sandbox (see ``SandboxPool.lease`` for the errors). The block
    runs inside a cancel scope the pool can cancel: at ``hold_timeout_seconds``
    (``SandboxTimeoutError``) or when the pool closes after its grace period
    (``PoolClosedError``). Leaving the block, however it ends, releases the sandbox
    (shielded). A Lease is entered once; call ``pool.lease()`` for another.
    """

    __slots__ = ("_closed_by_pool", "_hold", "_pool", "_sandbox", "_scope", "_timeout")

    def __init__(self, pool: SandboxPool, timeout: float, hold: float | None) -> None:
        self._pool = pool
        self._timeout = timeout
        self._hold = hold
        self._sandbox: Sandbox | None = None
        self._scope: anyio.CancelScope | None = None
        self._closed_by_pool = False

    @property
    def sandbox(self) -> Sandbox | None:
        """The leased sandbox while the block runs (None before)."""
        return self._sandbox

    async def __aenter__(self) -> Sandbox:
        if self._scope is not None:
            raise PoolError("a lease can be entered once; call pool.lease() again")
        pool = self._pool
        start = time.monotonic()
        sb, warm = await pool._acquire(self._timeout)
        pool._session.metrics.lease(time.monotonic() - start, warm=warm)
        self._sandbox = sb
        deadline = math.inf if self._hold is None else anyio.current_time() + self._hold
        self._scope = anyio.CancelScope(deadline=deadline)
        self._scope.__enter__()
        pool._leases.add(self)
        return sb

    def _cancel_for_close(self) -> None:
        self._closed_by_pool = True
        if self._scope is not None:
            self._scope.cancel()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        assert self._scope is not None and self._sandbox is not None
        pool, sb = self._pool, self._sandbox
        try:
            cut_short = self._scope.__exit__(exc_type, exc, tb)
        finally:
            pool._leases.discard(self)
            with anyio.CancelScope(shield=True):
                await pool._release(sb, clean=exc_type is None)
        if cut_short:
            if self._closed_by_pool:
                raise PoolClosedError("the pool closed while this lease was held", sandbox_id=sb.sandbox_id)
            raise SandboxTimeoutError(
                f"the lease was held longer than hold_timeout_seconds={self._hold:g}; its sandbox was destroyed",
                sandbox_id=sb.sandbox_id,
                infrastructure=False,
            )
        return False
