"""Lease: the async context manager ``SandboxPool.lease()`` returns."""

from __future__ import annotations

import asyncio
import time
from types import TracebackType
from typing import TYPE_CHECKING

import anyio

from .._errors import PoolClosedError, PoolError, SandboxTimeoutError

if TYPE_CHECKING:
    from .._sandbox import Sandbox
    from ._pool import SandboxPool

__all__ = ["Lease"]

_monotonic = time.monotonic
_current_task = asyncio.current_task


class Lease:
    """``async with pool.lease() as sb``: a ready sandbox for the duration of the block.

    Entering waits for a sandbox (see ``SandboxPool.lease`` for the errors). The pool
    can cut the block short: at ``hold_timeout_seconds`` (``SandboxTimeoutError``) or
    when the pool closes after its grace period (``PoolClosedError``). Leaving the
    block, however it ends, releases the sandbox (shielded when that has to wait). A
    Lease is entered once; call ``pool.lease()`` for another.

    With a hold timeout the block runs in an anyio cancel scope with that deadline
    (which the pool also cancels when it closes). Without one, no scope is entered (it
    would cost about as much as the rest of the lease): a pool closing past its grace
    period cancels the block's task natively, once, as ``asyncio.timeout`` does, and
    ``uncancel`` s it on the way out, so a cancellation from anyone else still
    propagates. Like any native asyncio cancellation it is not held off by an anyio
    shield inside the block.
    """

    __slots__ = (
        "_cancelled",
        "_cancelling",
        "_closed_by_pool",
        "_entered",
        "_hold",
        "_pool",
        "_sandbox",
        "_scope",
        "_task",
        "_timeout",
    )

    def __init__(self, pool: SandboxPool, timeout: float, hold: float | None) -> None:
        self._pool = pool
        self._timeout = timeout
        self._hold = hold
        self._sandbox: Sandbox | None = None
        self._scope: anyio.CancelScope | None = None
        self._task: asyncio.Task[object] | None = None
        self._cancelling = 0
        self._cancelled = False  # the pool cancelled self._task natively
        self._closed_by_pool = False
        self._entered = False

    @property
    def sandbox(self) -> Sandbox | None:
        """The leased sandbox while the block runs (None before)."""
        return self._sandbox

    async def __aenter__(self) -> Sandbox:
        if self._entered:
            raise PoolError("a lease can be entered once; call pool.lease() again")
        self._entered = True
        pool = self._pool
        start = _monotonic()
        sb = pool._lease_now()  # an idle sandbox, handed out without waiting
        if sb is None:
            sb, warm = await pool._acquire(self._timeout)
        else:
            warm = True
        pool._session.metrics.lease(_monotonic() - start, warm=warm)
        self._sandbox = sb
        hold = self._hold
        if hold is None:
            task = self._task = _current_task()
            if task is not None:
                self._cancelling = task.cancelling()
        else:
            scope = self._scope = anyio.CancelScope(deadline=anyio.current_time() + hold)
            scope.__enter__()
        pool._leases.add(self)
        return sb

    def _cancel_for_close(self) -> None:
        self._closed_by_pool = True
        if self._scope is not None:
            self._scope.cancel()
            return
        task = self._task
        # Not the task running this (a lease's own task closing its pool, shielded: nothing to interrupt).
        if task is not None and not self._cancelled and not task.done() and task is not _current_task():
            self._cancelled = True
            task.cancel()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        sb = self._sandbox
        assert sb is not None
        pool = self._pool
        scope = self._scope
        cut_short = False
        try:
            if scope is not None:
                cut_short = scope.__exit__(exc_type, exc, tb)
            elif self._cancelled:
                self._cancelled = False
                assert self._task is not None
                cut_short = (
                    self._task.uncancel() <= self._cancelling
                    and exc_type is not None
                    and issubclass(exc_type, asyncio.CancelledError)
                )
        finally:
            pool._leases.discard(self)
            clean = exc_type is None
            if not pool._release_now(sb, clean):  # most releases are synchronous; the rest await, shielded
                with pool._session.close_budget.shielded():
                    await pool._release(sb, clean=clean)
        if cut_short:
            if self._closed_by_pool:
                raise PoolClosedError("the pool closed while this lease was held", sandbox_id=sb.sandbox_id)
            raise SandboxTimeoutError(
                f"the lease was held longer than hold_timeout_seconds={self._hold:g}; its sandbox was destroyed",
                sandbox_id=sb.sandbox_id,
                infrastructure=False,
            )
        return False
