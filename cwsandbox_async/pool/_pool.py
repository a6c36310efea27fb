"""SandboxPool: pre-warmed sandboxes leased to coroutine rollouts (public API; internals in ``_pool_core``)."""

from __future__ import annotations

import math
import uuid
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskGroup, TaskStatus

from .._errors import (
    PoolClosedError,
    PoolError,
    PoolTimeoutError,
    SandboxValidationError,
)
from .._log import log
from .._types import SandboxStatus
from .._validate import validate_timeout
from ._core import PoolCore, ResetHook
from ._create import count_arg
from ._lease import Lease
from ._types import PoolState, check_transition

if TYPE_CHECKING:
    from .._session import Session

__all__ = ["ResetHook", "SandboxPool"]

#: How long closing waits for background work (creations, resets, stops) after the grace period.
CLOSE_TIMEOUT_SECONDS = 60.0


def _seconds(value: object, what: str) -> float:
    out = validate_timeout(value, what)
    assert out is not None
    return out


class SandboxPool(PoolCore):
    """Keeps ``size`` sandboxes warm and leases them to rollouts; never more than ``max_size`` alive.

    ``async with SandboxPool(session, size=64, max_size=256) as pool:`` starts warming
    at once; ``async with pool.lease() as sb:`` hands out a ready sandbox (at once when
    one is idle, otherwise in FIFO order, within ``lease_timeout_seconds``).

    - ``reuse=False`` (default): each lease gets a fresh sandbox, destroyed on release,
      and a replacement is warmed. ``reuse=True`` returns a sandbox to the idle set
      after a lease that ended without an exception, once ``reset(sb)`` succeeded
      (a failing or slow reset, or a dead sandbox, is discarded instead).
    - ``max_size`` (default ``2 * size``, at least 1) caps sandboxes alive, being
      created and being stopped. ``create_rate``/``create_burst`` add a token bucket
      on create attempts (retries included).
    - A failed create is retried ``create_attempts`` times with exponential back-off
      and jitter (from ``create_backoff_seconds`` up to ``create_backoff_max_seconds``).
      After ``max_consecutive_failures`` failed attempts in a row, waiting leases and
      ``wait_ready`` raise ``SandboxCreationError`` instead of waiting on; the pool
      keeps trying (with a growing cool-down) and recovers on the first success.
    - ``check_on_lease`` asks the backend for the sandbox's status before handing it
      out (a dead one is discarded and replaced unseen). That is cheap on the bundled
      backends (in memory on fake and local, the shared watch cache on Kubernetes; an
      API call only while the watch is down); turn it off for a backend where a status
      call is slow. ``health_check_interval_seconds`` also sweeps idle sandboxes
      periodically (``None`` turns the sweep off).
    - Closing (leaving the block, ``aclose()``, or leaving the Session) refuses new
      leases, fails waiting ones with ``PoolClosedError``, lets held leases finish for
      ``close_grace_seconds``, then cancels them (their ``async with`` raises
      ``PoolClosedError``) and destroys every sandbox the pool created.

    Other keyword arguments are ``SandboxDefaults`` overrides for the pool's sandboxes.
    Bad arguments raise ``SandboxValidationError``.
    """

    def __init__(
        self,
        session: Session,
        size: int = 8,
        max_size: int | None = None,
        *,
        reuse: bool = False,
        reset: ResetHook | None = None,
        reset_timeout_seconds: float = 30.0,
        create_rate: float | None = None,
        create_burst: int | None = None,
        create_attempts: int = 3,
        create_backoff_seconds: float = 0.5,
        create_backoff_max_seconds: float = 10.0,
        max_consecutive_failures: int = 5,
        lease_timeout_seconds: float = 30.0,
        hold_timeout_seconds: float | None = None,
        check_on_lease: bool = True,
        health_check_interval_seconds: float | None = 30.0,
        close_grace_seconds: float = 10.0,
        **sandbox_overrides: Any,
    ) -> None:
        size = count_arg(size, "size", 0)
        max_size = count_arg(max(2 * size, 1) if max_size is None else max_size, "max_size", 1)
        if size > max_size:
            raise SandboxValidationError(f"size ({size}) must not exceed max_size ({max_size})")
        if not isinstance(reuse, bool):
            raise SandboxValidationError("reuse must be a bool")
        if reset is not None and not reuse:
            raise SandboxValidationError("a reset hook needs reuse=True (without reuse every lease is fresh)")
        if reset is not None and not callable(reset):
            raise SandboxValidationError("reset must be an async callable taking the sandbox")
        super().__init__(
            session,
            session.defaults.with_overrides(**sandbox_overrides) if sandbox_overrides else session.defaults,
            size=size,
            max_size=max_size,
            reuse=reuse,
            reset=reset,
            reset_timeout=_seconds(reset_timeout_seconds, "reset_timeout_seconds"),
            check_on_lease=bool(check_on_lease),
            health_interval=validate_timeout(
                health_check_interval_seconds, "health_check_interval_seconds", allow_none=True
            ),
            creator_options={
                "rate": create_rate,
                "burst": create_burst,
                "attempts": create_attempts,
                "backoff": create_backoff_seconds,
                "backoff_max": create_backoff_max_seconds,
                "max_failures": max_consecutive_failures,
            },
        )
        self._lease_timeout = _seconds(lease_timeout_seconds, "lease_timeout_seconds")
        self._hold_timeout = validate_timeout(hold_timeout_seconds, "hold_timeout_seconds", allow_none=True)
        if isinstance(close_grace_seconds, bool) or not isinstance(close_grace_seconds, (int, float)):
            raise SandboxValidationError("close_grace_seconds must be a number of seconds")
        if not math.isfinite(close_grace_seconds) or close_grace_seconds < 0:
            raise SandboxValidationError(f"close_grace_seconds must be >= 0, got {close_grace_seconds!r}")
        self._grace = float(close_grace_seconds)
        self.pool_id = f"pool-{uuid.uuid4().hex[:8]}"
        self._host_tg: TaskGroup | None = None
        self._bg_scope: anyio.CancelScope | None = None
        self._bg_done = anyio.Event()
        self._closed = anyio.Event()

    # -- introspection ---------------------------------------------------------
    @property
    def state(self) -> PoolState:
        return self._state

    @property
    def size(self) -> int:
        """Idle sandboxes the pool keeps warm."""
        return self._size

    @property
    def max_size(self) -> int:
        """Hard cap on sandboxes alive, being created or being stopped."""
        return self._max_size

    @property
    def reuse(self) -> bool:
        return self._reuse

    def __repr__(self) -> str:
        s = self.statistics()
        return (
            f"<SandboxPool {s.state.value} size={s.size} max_size={s.max_size} "
            f"idle={s.idle} leased={s.leased} warming={s.warming} waiting={s.waiting}>"
        )

    def _transition(self, target: PoolState) -> None:
        check_transition(self._state, target)
        log.debug("pool state", old=self._state.value, new=target.value)
        self._state = target

    # -- lifecycle -------------------------------------------------------------
    async def __aenter__(self) -> SandboxPool:
        from .._session import SessionState

        check_transition(self._state, PoolState.OPEN)
        if self._session.state is not SessionState.OPEN:
            raise PoolError("the session is not open; open it first ('async with Session(...)')")
        self._host_tg = anyio.create_task_group()
        await self._host_tg.__aenter__()
        await self._host_tg.start(self._run)
        self._session.add_closer(self.aclose)
        self._transition(PoolState.OPEN)
        log.debug("pool opened", size=self._size, max_size=self._max_size, reuse=self._reuse)
        self._update()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            await self.aclose()
        finally:
            tg, self._host_tg = self._host_tg, None
            if tg is not None:  # its only child (_run) has ended; this returns at once
                await tg.__aexit__(None, None, None)

    async def _run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Host of the pool's background tasks: creations, destroys, resets, the health sweep."""
        try:
            with anyio.CancelScope() as scope:
                self._bg_scope = scope
                async with anyio.create_task_group() as tg:
                    self._tg = tg
                    task_status.started()
                    if self._health_interval is not None:
                        tg.start_soon(self._health_loop, name="pool health sweep")
                    await anyio.sleep_forever()
        except Exception as exc:  # a bug; logged rather than cancelling the code using the pool
            log.error("pool background tasks failed", error=repr(exc))
        finally:
            self._tg = None
            self._bg_done.set()

    async def aclose(self) -> None:
        """Stop leasing, let leases finish (``close_grace_seconds``), cancel the rest, destroy everything.

        Idempotent, and safe to call from any task: a second caller waits for the first.
        Runs shielded from cancellation, bounded by the grace period plus
        ``CLOSE_TIMEOUT_SECONDS``. Never raises for a sandbox that fails to stop (that is logged).
        """
        if self._state is PoolState.NEW:
            self._transition(PoolState.CLOSED)
            self._closed.set()
            return
        if self._state is not PoolState.OPEN:
            with self._session.close_budget.shielded(self._grace + CLOSE_TIMEOUT_SECONDS):
                await self._closed.wait()
            return
        self._transition(PoolState.CLOSING)
        self._session.remove_closer(self.aclose)
        self._fail_waiters(lambda: PoolClosedError("cannot lease from a closed pool"))
        self._update()
        with self._session.close_budget.shielded():
            try:
                with anyio.move_on_after(self._grace):
                    await self._until(lambda: not self._leases)
                for lease in list(self._leases):
                    lease._cancel_for_close()
                with anyio.move_on_after(self._session.timeouts.stop_seconds) as scope:
                    await self._until(lambda: not self._leases)
                if scope.cancelled_caught:
                    log.warning("leases ignored the pool closing; destroying their sandboxes", leases=len(self._leases))
                if self._bg_scope is not None:
                    self._bg_scope.cancel()
                with anyio.move_on_after(CLOSE_TIMEOUT_SECONDS) as scope:
                    await self._bg_done.wait()
                if scope.cancelled_caught:
                    log.warning("pool background tasks did not end in time")
                await self._destroy_remaining()
            finally:
                # The session's close budget may end this block at any await: the pool is closed anyway,
                # its background tasks cancelled, and what was not destroyed is left to the session.
                if self._bg_scope is not None:
                    self._bg_scope.cancel()
                self._transition(PoolState.CLOSED)
                self._closed.set()
                self._update()
                self._session.metrics.pool_closed(self.pool_id)
        log.debug("pool closed", created=self._creator.created, destroyed=self._destroyed)

    async def _destroy_remaining(self) -> None:
        while self._idle or self._out:
            victims = [*self._idle, *self._out]
            self._idle.clear()
            self._out.clear()
            self._destroying += len(victims)
            async with anyio.create_task_group() as tg:
                for sb in victims:
                    tg.start_soon(self._destroy, sb)

    # -- leasing -----------------------------------------------------------------
    def lease(self, timeout_seconds: float | None = None, *, hold_timeout_seconds: float | None = None) -> Lease:
        """``async with pool.lease() as sb:`` a ready sandbox, released when the block exits.

        Waits at most ``timeout_seconds`` (default ``lease_timeout_seconds``) for a
        sandbox, then raises ``PoolTimeoutError``. Raises ``PoolClosedError`` if the pool
        is closed or closes while waiting, and ``SandboxCreationError`` if the pool
        cannot create sandboxes (see ``max_consecutive_failures``).

        The block is bounded by ``hold_timeout_seconds`` (default: the pool's, None =
        unbounded): past it the block is cancelled, the sandbox destroyed and
        ``SandboxTimeoutError`` (``infrastructure=False``) raised. This and the lease
        timeout are what keep a rollout bounded when nothing cancels it from outside
        (an ART rollout coroutine, say). However the block ends (return, exception,
        cancellation), the sandbox is released: destroyed and replaced by default,
        returned to the pool with ``reuse=True`` only after a clean exit and reset.
        A block with a hold timeout runs in an anyio cancel scope; one without is cut
        short at close by a native cancellation of its task (see ``Lease``).
        """
        timeout = self._lease_timeout if timeout_seconds is None else _seconds(timeout_seconds, "timeout_seconds")
        if hold_timeout_seconds is None:
            return Lease(self, timeout, self._hold_timeout)
        return Lease(self, timeout, validate_timeout(hold_timeout_seconds, "hold_timeout_seconds"))

    # -- sizing ------------------------------------------------------------------
    async def wait_ready(self, timeout_seconds: float | None = None) -> None:
        """Wait until the idle target is met (``size`` idle, or as many as ``max_size`` leaves room for).

        Raises ``SandboxCreationError`` if the pool is failing to create sandboxes,
        ``PoolTimeoutError`` after ``timeout_seconds`` (None: no deadline of its own;
        every create attempt has one), ``PoolClosedError`` if the pool closes.
        """
        timeout = validate_timeout(timeout_seconds, "timeout_seconds", allow_none=True)
        self._check_can_lease()
        with anyio.move_on_after(math.inf if timeout is None else timeout):
            while True:
                changed = self._change()
                self._check_can_lease()
                room = self._max_size - len(self._out) - self._destroying
                if len(self._idle) >= min(self._size, room):
                    return
                if self._creator.failing:
                    raise self._creator.failing_error()
                await changed.wait()
        raise PoolTimeoutError(f"the pool was not ready within {timeout:g} s ({self!r})")

    async def resize(self, size: int, *, max_size: int | None = None) -> None:
        """Change the idle target (and optionally the cap). Growing warms in the background
        (``wait_ready`` waits for it); shrinking destroys surplus idle sandboxes and returns
        once they are gone. Leased sandboxes are never taken back: lowering ``max_size``
        below what is alive only stops creation until enough are released.
        """
        self._check_can_lease()
        new_max = self._max_size if max_size is None else count_arg(max_size, "max_size", 1)
        new_size = count_arg(size, "size", 0)
        if new_size > new_max:
            raise SandboxValidationError(f"size ({new_size}) must not exceed max_size ({new_max})")
        self._size, self._max_size = new_size, new_max
        surplus = max(len(self._idle) - new_size, min(len(self._idle), self._alive() - new_max))
        trimmed = [self._idle.popleft() for _ in range(max(0, surplus))]  # oldest first
        for sb in trimmed:
            self._discard_soon(sb)
        self._update()
        log.info("pool resized", size=new_size, max_size=new_max, trimmed=len(trimmed))
        with anyio.move_on_after(2 * self._session.timeouts.stop_seconds):
            await self._until(lambda: all(sb.status is SandboxStatus.COMPLETED for sb in trimmed))
