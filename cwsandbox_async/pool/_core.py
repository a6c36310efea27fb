"""The pool's bookkeeping: where each sandbox is, creating, handing out, health, release.

Accounting: every sandbox the pool owns is in exactly one place: ``idle`` (warm,
ready), ``out`` (leased, or being health-checked or reset), a creation slot
(``warming``, held through retries and back-off) or ``destroying``. Moves between
them happen in synchronous steps, and a creation slot is only taken while
``idle + out + warming + destroying < max_size``. That sum is an upper bound on what
the backend holds for this pool, so ``max_size`` is a hard cap whatever the
interleaving of leases, failures, retries, resizes and cancellations.

Waiters queue FIFO; a sandbox is handed to the first one synchronously (moved to
``out`` before its task runs). A waiter cancelled after that, before it ran, passes
the sandbox on; a lease cancelled during its health check puts it back.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskGroup

from .._errors import PoolClosedError, PoolError, PoolTimeoutError, SandboxError
from .._log import log
from .._types import SandboxStatus
from ._create import Creator
from ._types import PoolState, PoolStatistics

if TYPE_CHECKING:
    from .._sandbox import Sandbox
    from .._session import Session
    from .._types import SandboxDefaults
    from ._lease import Lease

__all__ = ["PoolCore", "ResetHook"]

#: ``SandboxStatus.is_terminal``, read from the sandbox's field in the hot paths (no property calls).
_TERMINAL = frozenset({SandboxStatus.COMPLETED, SandboxStatus.FAILED})

#: ``async def reset(sandbox) -> None``; raising (or timing out) discards the sandbox.
ResetHook = Callable[["Sandbox"], Awaitable[None]]


class _Waiter:
    __slots__ = ("error", "event", "sandbox")

    def __init__(self) -> None:
        self.event = asyncio.Event()  # waited on once, unset: as anyio.Event on asyncio, minus its look-up
        self.sandbox: Sandbox | None = None
        self.error: BaseException | None = None


class PoolCore:
    """State and internal operations of a ``SandboxPool`` (whose public API lives in ``_pool``)."""

    def __init__(
        self,
        session: Session,
        defaults: SandboxDefaults,
        *,
        size: int,
        max_size: int,
        reuse: bool,
        reset: ResetHook | None,
        reset_timeout: float,
        check_on_lease: bool,
        health_interval: float | None,
        creator_options: dict[str, Any],
    ) -> None:
        self._session = session
        self._defaults = defaults
        self._size = size
        self._max_size = max_size
        self._reuse = reuse
        self._reset = reset
        self._reset_timeout = reset_timeout
        self._check_on_lease = check_on_lease
        self._health_interval = health_interval
        self._creator = Creator(
            session,
            defaults,
            keep_going=self._keep_creating,
            on_failing=lambda: self._fail_waiters(self._creator.failing_error),
            **creator_options,
        )
        self._state = PoolState.NEW
        self._idle: deque[Sandbox] = deque()
        self._out: set[Sandbox] = set()
        self._waiters: deque[_Waiter] = deque()
        self._leases: set[Lease] = set()
        self._warming = 0
        self._destroying = 0
        self._destroyed = self._warm_hits = self._cold_waits = self._timeouts = self._discarded = self._max_alive = 0
        self._timer_pending = False
        self._changed: anyio.Event | None = None  # made by whoever waits for a change; set by _update
        self._tg: TaskGroup | None = None
        self._stopped: weakref.WeakSet[Sandbox] = weakref.WeakSet()  # counted in ``destroyed`` once
        self.pool_id = ""

    def statistics(self) -> PoolStatistics:
        """A frozen snapshot of the pool's gauges and counters."""
        return PoolStatistics(
            state=self._state,
            size=self._size,
            max_size=self._max_size,
            idle=len(self._idle),
            leased=len(self._out),
            warming=self._warming,
            waiting=len(self._waiters),
            destroying=self._destroying,
            created=self._creator.created,
            destroyed=self._destroyed,
            failures=self._creator.failures,
            retries=self._creator.retries,
            warm_hits=self._warm_hits,
            cold_waits=self._cold_waits,
            timeouts=self._timeouts,
            discarded=self._discarded,
            max_alive=self._max_alive,
        )

    # -- state changes ---------------------------------------------------------
    def _alive(self) -> int:
        return len(self._idle) + len(self._out) + self._warming + self._destroying

    def _change(self) -> anyio.Event:
        """An event set by the next ``_update`` (take it before checking the condition you wait for)."""
        changed = self._changed
        if changed is None:
            changed = self._changed = anyio.Event()
        return changed

    async def _until(self, done: Callable[[], bool]) -> None:
        while True:
            changed = self._change()
            if done():
                return
            await changed.wait()

    def _update(self) -> None:
        """Called after every change: refill, publish gauges, wake whoever waits on a condition."""
        state = self._state
        idle, out, warming = len(self._idle), len(self._out), self._warming
        alive = idle + out + warming + self._destroying
        if (
            state is PoolState.OPEN
            and alive < self._max_size
            and self._size + len(self._waiters) > idle + warming  # else _fill has nothing to start
        ):
            self._fill()
            warming = self._warming
            alive = idle + out + warming + self._destroying
        if alive > self._max_alive:
            self._max_alive = alive
        if state is not PoolState.CLOSED:
            self._session.metrics.pool_gauges(idle=idle, leased=out, warming=warming, pool_id=self.pool_id)
        changed = self._changed
        if changed is not None:
            self._changed = None
            changed.set()

    def _fill(self) -> None:
        """Start creations for the idle target plus queued leases, within ``max_size``."""
        tg = self._tg
        if self._state is not PoolState.OPEN or tg is None:
            return
        wanted = self._size + len(self._waiters) - len(self._idle) - self._warming
        n = min(wanted, self._max_size - self._alive())
        if n <= 0:
            return
        if asyncio.get_running_loop().time() < self._creator.cooling_until:
            if not self._timer_pending:
                self._timer_pending = True
                tg.start_soon(self._wake_at, self._creator.cooling_until, name="pool cool-down")
            return
        for _ in range(n):
            self._warming += 1
            tg.start_soon(self._warm, name="pool warm")

    async def _wake_at(self, when: float) -> None:
        try:
            await anyio.sleep_until(when)
        finally:
            self._timer_pending = False
        self._update()

    def _deliver(self, sb: Sandbox, *, front: bool = False) -> None:
        """Place a ready sandbox that is in no set yet: first waiter, else idle, else destroy it."""
        if self._state is not PoolState.OPEN or sb._status in _TERMINAL:
            self._discard_soon(sb)
            return
        idle = self._idle
        if self._waiters:
            waiter = self._waiters.popleft()
            waiter.sandbox = sb
            self._out.add(sb)
            waiter.event.set()
        elif (
            len(idle) < self._size
            and len(idle) + len(self._out) + self._warming + self._destroying < self._max_size  # _alive()
        ):
            if front:
                idle.appendleft(sb)
            else:
                idle.append(sb)
        else:
            self._discard_soon(sb)

    def _discard_soon(self, sb: Sandbox) -> None:
        """Destroy a sandbox that is in no set, in the background (slot held until it is gone)."""
        if sb.status is SandboxStatus.COMPLETED:  # already stopped (by the pool, or by its user)
            if sb not in self._stopped:
                self._stopped.add(sb)
                self._destroyed += 1
            return
        if self._tg is None:  # background gone (closing): _destroy_remaining takes idle sandboxes
            self._idle.append(sb)
            return
        self._destroying += 1
        self._tg.start_soon(self._destroy, sb, name="pool destroy")

    async def _discard(self, sb: Sandbox) -> None:
        if self._tg is not None:
            self._discard_soon(sb)
            self._update()
            return
        self._destroying += 1
        self._update()
        await self._destroy(sb)

    async def _destroy(self, sb: Sandbox) -> None:
        """Stop one sandbox (shielded, bounded by the stop deadline); then free its slot."""
        with self._session.close_budget.shielded():
            counted = sb not in self._stopped
            self._stopped.add(sb)
            try:
                await sb.stop()
            except SandboxError:  # logged by stop(); one more try through the session
                await self._session._destroy_quietly(sb.sandbox_id)
            finally:
                self._destroying -= 1
                if counted:
                    self._destroyed += 1
                self._update()

    def _fail_waiters(self, make_error: Callable[[], BaseException]) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            waiter.error = make_error()
            waiter.event.set()

    # -- creating ----------------------------------------------------------------
    async def _warm(self) -> None:
        sb: Sandbox | None = None
        try:
            sb = await self._creator.create()
        except Exception:
            pass  # counted and logged by the creator; the pool cools down and tries again
        finally:
            self._warming -= 1
            if sb is not None:
                self._deliver(sb)
            self._update()

    def _keep_creating(self) -> bool:
        from .._session import SessionState

        return self._state is PoolState.OPEN and self._session.state is SessionState.OPEN

    # -- health ------------------------------------------------------------------
    async def _probe(self, sb: Sandbox) -> bool:
        """Whether the backend still reports the sandbox alive (a failed status call counts as dead)."""
        if sb.status.is_terminal:
            return False
        try:
            return not (await sb.refresh_status()).is_terminal
        except SandboxError:
            return False

    def _drop_dead(self, sb: Sandbox) -> None:
        self._discarded += 1
        log.info("discarding a dead idle sandbox", sandbox_id=sb.sandbox_id)
        self._discard_soon(sb)
        self._update()

    async def _health_loop(self) -> None:
        assert self._health_interval is not None
        while True:
            await anyio.sleep(self._health_interval)
            for sb in list(self._idle):
                if sb in self._idle and not await self._probe(sb) and sb in self._idle:
                    self._idle.remove(sb)
                    self._drop_dead(sb)

    # -- leasing -----------------------------------------------------------------
    def _check_can_lease(self) -> None:
        if self._state is PoolState.NEW:
            raise PoolError("the pool is not open; use 'async with SandboxPool(...)'")
        if self._state is not PoolState.OPEN:
            raise PoolClosedError("cannot lease from a closed pool")

    def _lease_now(self) -> Sandbox | None:
        """A lease's fast path: an idle sandbox handed out at once, when no health check has to be awaited.

        None if the lease has to go through ``_acquire``: nothing idle, a check on lease,
        the next idle sandbox known dead (``_acquire`` discards it and keeps the lease's
        turn), or the pool not open (``_acquire`` raises).
        """
        idle = self._idle
        if self._state is not PoolState.OPEN or self._check_on_lease or not idle or idle[0]._status in _TERMINAL:
            return None
        sb = idle.popleft()
        self._out.add(sb)
        self._warm_hits += 1
        self._update()
        return sb

    async def _acquire(self, timeout_seconds: float) -> tuple[Sandbox, bool]:
        """A checked, running sandbox and whether it was warm (idle at once). Raises as ``lease()`` says."""
        self._check_can_lease()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_seconds
        front = False
        if self._idle:
            # The common case: an idle sandbox and a health check to await. The lease's deadline
            # bounds only that check here, natively (``within``), which costs a fraction of a scope.
            sb = self._idle.popleft()
            self._out.add(sb)
            self._update()
            try:
                with anyio.fail_after(timeout_seconds):
                    ok = await self._check(sb)  # a cancelled check gives the sandbox back
            except TimeoutError:
                raise self._timed_out(timeout_seconds)  # noqa: B904 - chained to the last creation error
            if ok:
                return await self._checked(sb, True), True
            front = True  # it was our turn: keep it after a dead sandbox
        return await self._acquire_waiting(timeout_seconds, deadline, front)

    async def _checked(self, sb: Sandbox, warm: bool) -> Sandbox:
        """A sandbox that passed its check, counted; if the pool closed meanwhile, destroyed (``PoolClosedError``)."""
        if self._state is PoolState.OPEN:
            if warm:
                self._warm_hits += 1
            else:
                self._cold_waits += 1
            return sb
        self._out.discard(sb)
        await self._discard(sb)
        raise PoolClosedError("cannot lease from a closed pool")

    def _timed_out(self, timeout_seconds: float) -> PoolTimeoutError:
        self._timeouts += 1
        stats = self.statistics()
        err = PoolTimeoutError(
            f"no sandbox could be leased within {timeout_seconds:g} s (idle={stats.idle}, leased={stats.leased}, "
            f"warming={stats.warming}, waiting={stats.waiting}, max_size={stats.max_size})"
        )
        err.__cause__ = self._creator.last_error if self._creator.consecutive_failures else None
        err.__suppress_context__ = True  # as ``raise err from cause``
        return err

    async def _acquire_waiting(self, timeout_seconds: float, deadline: float, front: bool) -> tuple[Sandbox, bool]:
        """``_acquire`` when it may have to wait for a sandbox: all of it within one cancel scope."""
        warm = True
        with anyio.CancelScope(deadline=deadline):
            while True:
                self._check_can_lease()
                if self._idle:
                    sb = self._idle.popleft()
                    self._out.add(sb)
                    self._update()
                else:
                    warm = False
                    sb = await self._wait_for_sandbox(front)
                if await self._check(sb):
                    return await self._checked(sb, warm), warm
                front = True  # it was our turn: keep it after a dead sandbox
        raise self._timed_out(timeout_seconds)

    async def _wait_for_sandbox(self, front: bool) -> Sandbox:
        waiter = _Waiter()
        if front:
            self._waiters.appendleft(waiter)
        else:
            self._waiters.append(waiter)
        self._update()
        try:
            await waiter.event.wait()
        except BaseException:
            if waiter.sandbox is not None:  # handed to us just as we were cancelled: pass it on
                self._out.discard(waiter.sandbox)
                self._deliver(waiter.sandbox, front=True)
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
            self._update()
            raise
        if waiter.error is not None:
            raise waiter.error
        assert waiter.sandbox is not None
        return waiter.sandbox

    async def _check(self, sb: Sandbox) -> bool:
        """Health-check a sandbox taken for a lease (it is in ``out``); a dead one is discarded."""
        try:
            ok = await self._probe(sb) if self._check_on_lease else not sb.status.is_terminal
        except BaseException:  # cancelled mid-check: it goes back, unharmed
            self._out.discard(sb)
            self._deliver(sb, front=True)
            self._update()
            raise
        if not ok:
            self._out.discard(sb)
            self._drop_dead(sb)
        return ok

    def _release_now(self, sb: Sandbox, clean: bool) -> bool:
        """``_release`` when it needs no await (nearly always: the slow work runs in the background).

        False if the caller must await ``_release`` (shielded): only when the pool's
        background task group is gone (closing) and the sandbox must be destroyed here.
        """
        out = self._out
        if sb not in out:  # the pool already destroyed it (close deadline)
            self._update()
            return True
        if clean and self._reuse and self._state is PoolState.OPEN and sb._status not in _TERMINAL:
            if self._reset is None:
                out.discard(sb)
                self._deliver(sb)
                self._update()
                return True
            if self._tg is not None:
                self._tg.start_soon(self._recycle, sb, name="pool reset")
                return True
        if self._tg is None:
            return False
        out.discard(sb)
        self._discard_soon(sb)
        self._update()
        return True

    async def _release(self, sb: Sandbox, *, clean: bool) -> None:
        """Give a leased sandbox back: destroy it, or (reuse, clean exit) reset it and return it."""
        if self._release_now(sb, clean=clean):
            return
        self._out.discard(sb)
        await self._discard(sb)

    async def _recycle(self, sb: Sandbox) -> None:
        """Run the reset hook (bounded); return the sandbox on success, discard it otherwise."""
        assert self._reset is not None
        ok = False
        try:
            with anyio.fail_after(self._reset_timeout):
                await self._reset(sb)
            ok = not sb.status.is_terminal
        except Exception as exc:
            self._discarded += 1
            log.warning("sandbox reset failed; discarding it", sandbox_id=sb.sandbox_id, error=repr(exc))
        finally:
            self._out.discard(sb)
            if ok:
                self._deliver(sb)
            else:
                self._discard_soon(sb)
            self._update()
