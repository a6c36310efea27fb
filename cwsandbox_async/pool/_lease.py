"""Lease: the async context manager ``SandboxPool.lease()`` returns, and the narrow interface it leases through."""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Protocol

import anyio

from .._errors import PoolClosedError, PoolError, SandboxTimeoutError

if TYPE_CHECKING:
    from .._sandbox import Sandbox

__all__ = ["Lease", "LeaseSource"]


class LeaseSource(Protocol):
    """What a lease needs from its pool (``Handout`` implements it)."""

    async def acquire(self, wait_seconds: float, hold: float | None) -> Sandbox:
        """A ready sandbox within ``wait_seconds``, fit for a hold of ``hold`` seconds."""

    def holding(self, cut_short: Callable[[], None]) -> object:
        """The lease's block starts; ``cut_short()`` cancels it (pool closing). Returns a token for ``held``."""

    def held(self, token: object) -> None:
        """The lease's block ended."""

    async def release(self, sandbox: Sandbox, *, clean: bool) -> None:
        """Give the sandbox back (``clean``: the block ended without an exception and was not cut short)."""


class Lease:
    """``async with pool.lease() as sb``: a ready sandbox for the duration of the block.

    Entering waits for a sandbox (see ``SandboxPool.lease`` for the errors). The block
    runs in an anyio cancel scope, which ends it at ``hold_timeout_seconds``
    (``SandboxTimeoutError``, ``infrastructure=False``) or when the pool closes after its
    grace period (``PoolClosedError``). Leaving the block, however it ends, releases the
    sandbox. A Lease is entered once; call ``pool.lease()`` for another.
    """

    __slots__ = ("_cm", "_cut_by_pool", "_hold", "_sandbox", "_scope", "_source", "_timeout")

    def __init__(self, source: LeaseSource, timeout: float, hold: float | None) -> None:
        self._source = source
        self._timeout = timeout
        self._hold = hold
        self._sandbox: Sandbox | None = None
        self._scope: anyio.CancelScope | None = None
        self._cut_by_pool = False
        self._cm: contextlib.AbstractAsyncContextManager[Sandbox] | None = None

    @property
    def sandbox(self) -> Sandbox | None:
        """The leased sandbox while the block runs (None before)."""
        return self._sandbox

    async def __aenter__(self) -> Sandbox:
        if self._cm is not None:
            raise PoolError("a lease can be entered once; call pool.lease() again", infrastructure=False)
        self._cm = self._held()
        return await self._cm.__aenter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        assert self._cm is not None, "__aexit__ without __aenter__"
        return await self._cm.__aexit__(exc_type, exc, tb)

    def _cut_short(self) -> None:
        self._cut_by_pool = True
        if self._scope is not None:
            self._scope.cancel()

    @contextlib.asynccontextmanager
    async def _held(self) -> AsyncIterator[Sandbox]:
        """The whole lease in one function: acquire, the block in its scope, release, the verdict."""
        sb = await self._source.acquire(self._timeout, self._hold)
        self._sandbox = sb
        deadline = math.inf if self._hold is None else anyio.current_time() + self._hold
        clean = False
        try:
            with anyio.CancelScope(deadline=deadline) as scope:
                self._scope = scope
                token = self._source.holding(self._cut_short)
                try:
                    yield sb
                    clean = not scope.cancel_called
                finally:
                    self._source.held(token)
        finally:
            await self._source.release(sb, clean=clean)
        if scope.cancelled_caught:
            if self._cut_by_pool:
                raise PoolClosedError(
                    "the pool closed while this lease was held", sandbox_id=sb.sandbox_id, infrastructure=False
                )
            raise SandboxTimeoutError(
                f"the lease was held longer than hold_timeout_seconds={self._hold:g}; its sandbox was destroyed",
                sandbox_id=sb.sandbox_id,
                infrastructure=False,
            )
