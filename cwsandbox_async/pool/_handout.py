"""Handing sandboxes out and taking them back: the pool's side of a ``Lease`` (the ``LeaseSource``).

``acquire`` takes the oldest idle sandbox or queues for the next ready one (FIFO), checks
it (``Health.fit_for_lease``) and hands it out, all within the lease's deadline. A lease
cancelled while it waits or while its sandbox is checked gives the sandbox back (to the
front); a dead one is discarded and the lease keeps its turn. ``release`` destroys the
sandbox (fresh per lease), or with ``reuse`` returns it after a clean block, through the
reset hook if there is one. Held leases are registered so that closing can cut them short.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio

from .._errors import PoolError, PoolTimeoutError
from .._log import log
from ._ledger import Ledger

if TYPE_CHECKING:
    from .._sandbox import Sandbox
    from ._disposal import Disposal
    from ._health import Health
    from ._options import ResetHook

__all__ = ["Handout"]


class Handout:
    """Implements ``LeaseSource`` for one pool.

    ``check_open()`` raises the error a lease gets when the pool does not serve leases
    (not open, closed or failed) and ``is_open()`` says whether it does; ``record(wait,
    warm)`` counts a lease in the session's metrics; ``timed_out(timeout)`` makes the
    error for a lease that waited in vain.
    """

    def __init__(
        self,
        ledger: Ledger,
        health: Health,
        disposal: Disposal,
        *,
        reuse: bool,
        reset: ResetHook | None,
        reset_timeout: float,
        check_open: Callable[[], None],
        is_open: Callable[[], bool],
        record: Callable[[float, bool], None],
        timed_out: Callable[[float], PoolTimeoutError],
    ) -> None:
        self._ledger = ledger
        self._health = health
        self._disposal = disposal
        self._reuse = reuse
        self._reset = reset
        self._reset_timeout = reset_timeout
        self._check_open = check_open
        self._is_open = is_open
        self._record = record
        self._timed_out = timed_out
        self._held: dict[object, tuple[Callable[[], None], object]] = {}

    # -- acquire ---------------------------------------------------------------------
    async def acquire(self, wait_seconds: float, hold: float | None) -> Sandbox:
        """A checked sandbox within ``wait_seconds``. Raises as ``SandboxPool.lease`` says."""
        self._check_open()
        start = anyio.current_time()
        warm, front = True, False
        with anyio.move_on_after(wait_seconds):
            while True:
                self._check_open()
                sb = self._ledger.take_idle()
                if sb is None:
                    warm = False
                    sb = await self._wait(front)
                if await self._check(sb, hold):
                    break
                front = True  # it was our turn: keep it after a dead sandbox
            try:
                self._check_open()  # closed or failed while we checked it
            except PoolError:
                self._ledger.out.discard(sb)
                await self._disposal.discard(sb)
                raise
            if warm:
                self._ledger.warm_hits += 1
            else:
                self._ledger.cold_waits += 1
            self._record(anyio.current_time() - start, warm)
            return sb
        self._ledger.timeouts += 1
        raise self._timed_out(wait_seconds)

    async def _wait(self, front: bool) -> Sandbox:
        waiter = self._ledger.enqueue(front=front)
        try:
            await waiter.event.wait()
        except BaseException:  # cancelled or timed out: leave the queue; pass on a sandbox handed over meanwhile
            handed = self._ledger.abandon(waiter)
            if handed is not None:
                self._give_back(handed)
            raise
        if waiter.error is not None:
            raise waiter.error
        assert waiter.sandbox is not None
        return waiter.sandbox

    async def _check(self, sb: Sandbox, hold: float | None) -> bool:
        """Check a sandbox taken for a lease (it is in ``out``); a dead one is discarded."""
        try:
            ok = await self._health.fit_for_lease(sb, hold)
        except BaseException:  # cancelled mid-check: it goes back, unharmed
            self._ledger.out.discard(sb)
            self._give_back(sb)
            raise
        if not ok:
            self._ledger.out.discard(sb)
            self._ledger.discarded += 1
            log.info("discarding a sandbox unfit for a lease", sandbox_id=sb.sandbox_id)
            self._disposal.discard_soon(sb)
        return ok

    def _give_back(self, sb: Sandbox) -> None:
        """A sandbox in no set goes back to the front (next waiter or idle), else is destroyed."""
        if not (self._is_open() and self._ledger.place(sb, front=True)):
            self._disposal.discard_soon(sb)

    # -- holding ---------------------------------------------------------------------
    def holding(self, cut_short: Callable[[], None]) -> object:
        token = object()
        self._held[token] = (cut_short, anyio.get_current_task().id)
        return token

    def held(self, token: object) -> None:
        self._held.pop(token, None)
        self._ledger.notify()

    def leases_held(self, *, but_this_task: bool = False) -> int:
        """Leases whose block is running (optionally not counting the current task's own)."""
        if not but_this_task:
            return len(self._held)
        me = anyio.get_current_task().id
        return sum(1 for _, task in self._held.values() if task != me)

    def cut_short_all(self) -> None:
        """Cancel every held lease's block (pool closing past its grace)."""
        for cut_short, _ in list(self._held.values()):
            cut_short()

    # -- release ---------------------------------------------------------------------
    async def release(self, sandbox: Sandbox, *, clean: bool) -> None:
        """Destroy the sandbox, or (reuse, clean block, pool open) reset it and return it to the pool."""
        ledger = self._ledger
        if sandbox not in ledger.out:  # closing already took it
            return
        if clean and self._reuse and self._is_open() and not sandbox.status.is_terminal:
            if self._reset is None:
                ledger.out.discard(sandbox)
                self._give_back_idle(sandbox)
                return
            if self._disposal.spawn(self._recycle, sandbox, name="pool reset"):
                return
        ledger.out.discard(sandbox)
        await self._disposal.discard(sandbox)

    def _give_back_idle(self, sb: Sandbox) -> None:
        if not self._ledger.place(sb):
            self._disposal.discard_soon(sb)

    async def _recycle(self, sb: Sandbox) -> None:
        """Run the reset hook (bounded); return the sandbox on success, discard it otherwise."""
        assert self._reset is not None
        ok = False
        try:
            with anyio.fail_after(self._reset_timeout):
                await self._reset(sb)
            ok = not sb.status.is_terminal
            if not ok:
                self._ledger.discarded += 1
        except Exception as exc:  # the user's hook: any failure (or its timeout) discards the sandbox
            self._ledger.discarded += 1
            log.warning("sandbox reset failed; discarding it", sandbox_id=sb.sandbox_id, error=repr(exc))
        finally:
            self._ledger.out.discard(sb)
            if ok and self._is_open():
                self._give_back_idle(sb)
            else:  # failed, or cancelled (closing), or the pool closed meanwhile
                self._disposal.discard_soon(sb)
