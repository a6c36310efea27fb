"""SandboxPool: pre-warmed sandboxes leased to coroutine rollouts.

The pool *has* its parts, each an object with a small interface:
``Ledger`` (where every sandbox is, the waiters, the counters), ``Handout`` (acquire and
release for a ``Lease``), ``Refill`` + ``Creator`` + ``Pacer`` (creating sandboxes, how
many at once, how fast), ``Health`` (checks at lease, the idle sweep), ``Disposal``
(destroying) and ``Background`` (the one task group their background work runs in).
This module owns the lifecycle (NEW -> OPEN -> [FAILED] -> CLOSING -> CLOSED) and wires
the parts; none of them reaches into another.
"""

from __future__ import annotations

import functools
import uuid
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio

from .._errors import PoolClosedError, PoolError, PoolTimeoutError, SandboxValidationError
from .._log import log
from .._validate import validate_timeout
from ._background import Background
from ._closing import wind_down
from ._create import Creator
from ._disposal import Disposal
from ._handout import Handout
from ._health import Health
from ._lease import Lease
from ._ledger import Ledger
from ._options import PoolOptions, ResetHook, count_arg, seconds_arg
from ._pacing import Pacer
from ._refill import Refill
from ._source import SandboxSource
from ._types import Lifecycle, PoolState, PoolStatistics, check_transition

if TYPE_CHECKING:
    from .._sandbox import Sandbox

__all__ = ["ResetHook", "SandboxPool"]


class SandboxPool:
    """Keeps ``size`` sandboxes warm and leases them to rollouts; never more than ``max_size`` alive.

    ``async with SandboxPool(session, size=64, max_size=256) as pool:`` starts warming
    at once; ``async with pool.lease() as sb:`` hands out a ready sandbox (at once when
    one is idle, otherwise in FIFO order, within ``lease_timeout_seconds``).

    - ``reuse=False`` (default): each lease gets a fresh sandbox, destroyed on release,
      and a replacement is warmed. ``reuse=True`` returns a sandbox to the idle set
      after a lease that ended without an exception, once ``reset(sb)`` succeeded
      (a failing or slow reset, or a dead sandbox, is discarded instead).
    - ``max_size`` (default ``2 * size``, at least 1) caps sandboxes alive, being
      created and being stopped.
    - Creations are paced by what they cost: at most ``create_concurrency`` at once
      (default: adaptive, grown while create latency stays near the lowest measured and
      cut when it climbs or creates fail; ``statistics().create_limit``), and optionally
      ``create_rate`` per second (burst ``create_burst``). No rate limit by default.
    - A create the platform failed (``infrastructure``) is retried ``create_attempts`` times with
      back-off (``create_backoff_seconds`` up to ``create_backoff_max_seconds``); after
      ``max_consecutive_failures`` in a row, leases and ``wait_ready`` raise ``SandboxCreationError``.
      A caller's mistake (a validation error, refused credentials) fails them at once, itself.
      The pool keeps trying (a growing cool-down) and recovers on the first success.
    - ``check_on_lease`` asks the backend for the sandbox's status before handing it
      out (a dead one is discarded and replaced unseen). ``health_check_interval_seconds``
      also sweeps idle sandboxes periodically (``None`` turns the sweep off). A lease with
      a hold timeout sets the sandbox's backend-side lifetime (``Backend.set_lifetime``)
      to the hold timeout plus ``lifetime_margin_seconds``.
    - If the pool's background work fails (a bug: an unexpected exception), the pool
      moves to ``FAILED``: waiting and later leases raise ``PoolError`` chained to it at
      once, and ``statistics().failure`` holds it. Leases already held keep their sandbox.
    - Closing (leaving the block, ``aclose()``, or leaving the Session) refuses new
      leases, fails waiting ones with ``PoolClosedError``, lets held leases finish for
      ``close_grace_seconds``, then cancels them (their ``async with`` raises
      ``PoolClosedError``) and destroys every sandbox the pool created, all within one
      budget (see ``aclose``).

    Other keyword arguments are ``SandboxDefaults`` overrides for the pool's sandboxes.
    Every setting is described in ``PoolOptions``. Bad arguments raise ``SandboxValidationError``.
    """

    def __init__(
        self,
        session: SandboxSource,
        size: int = 8,
        max_size: int | None = None,
        *,
        reuse: bool = False,
        reset: ResetHook | None = None,
        reset_timeout_seconds: float = 30.0,
        create_concurrency: int | None = None,
        create_latency_tolerance: float = 3.0,
        create_rate: float | None = None,
        create_burst: int | None = None,
        create_attempts: int = 3,
        create_backoff_seconds: float = 0.5,
        create_backoff_max_seconds: float = 10.0,
        max_consecutive_failures: int = 5,
        lease_timeout_seconds: float = 30.0,
        hold_timeout_seconds: float | None = None,
        lifetime_margin_seconds: float = 60.0,
        check_on_lease: bool = True,
        health_check_interval_seconds: float | None = 30.0,
        close_grace_seconds: float = 10.0,
        close_timeout_seconds: float | None = None,
        **sandbox_overrides: Any,
    ) -> None:
        opts = self._options = PoolOptions(
            size=size,
            max_size=max_size,
            reuse=reuse,
            reset=reset,
            reset_timeout_seconds=reset_timeout_seconds,
            create_concurrency=create_concurrency,
            create_latency_tolerance=create_latency_tolerance,
            create_rate=create_rate,
            create_burst=create_burst,
            create_attempts=create_attempts,
            create_backoff_seconds=create_backoff_seconds,
            create_backoff_max_seconds=create_backoff_max_seconds,
            max_consecutive_failures=max_consecutive_failures,
            lease_timeout_seconds=lease_timeout_seconds,
            hold_timeout_seconds=hold_timeout_seconds,
            lifetime_margin_seconds=lifetime_margin_seconds,
            check_on_lease=check_on_lease,
            health_check_interval_seconds=health_check_interval_seconds,
            close_grace_seconds=close_grace_seconds,
            close_timeout_seconds=close_timeout_seconds,
        )
        defaults = session.defaults.with_overrides(**sandbox_overrides) if sandbox_overrides else session.defaults
        self._source = session
        self.pool_id = f"pool-{uuid.uuid4().hex[:8]}"
        self._life = Lifecycle(self.pool_id)
        self._closed = anyio.Event()
        self._ledger = Ledger(opts.size, opts.cap, on_change=self._publish)
        self._background = Background(f"{self.pool_id} background", on_failure=self._fail)
        self._disposal = Disposal(self._ledger, self._background)
        self._pacer = Pacer(
            fixed=opts.create_concurrency,
            ceiling=opts.cap,
            tolerance=opts.create_latency_tolerance,
            rate=opts.create_rate,
            burst=opts.create_burst_or_default if opts.create_rate is not None else 1,
        )
        self._creator = Creator(
            session.create_sandbox,
            defaults,
            opts,
            self._pacer,
            keep_going=self._can_create,
            on_failing=lambda: self._ledger.fail_waiters(self._creator.failing_error),
            on_retry=lambda: session.metrics.retry("create"),
        )
        self._refill = Refill(
            self._ledger,
            self._creator,
            self._pacer,
            spawn=self._background.spawn,
            can_create=self._can_create,
            deliver=self._deliver,
        )
        self._health = Health(
            check_on_lease=opts.check_on_lease,
            interval=opts.health_check_interval_seconds,
            lifetime_margin=opts.lifetime_margin_seconds,
            operation_timeout=defaults.operation_timeout_seconds,
        )
        self._handout = Handout(
            self._ledger,
            self._health,
            self._disposal,
            reuse=opts.reuse,
            reset=opts.reset,
            reset_timeout=opts.reset_timeout_seconds,
            check_open=self._life.check_open,
            is_open=lambda: self._life.is_open,
            record=lambda wait, warm: session.metrics.lease(wait, warm=warm),
            timed_out=self._timed_out,
        )

    # -- introspection ---------------------------------------------------------------
    @property
    def state(self) -> PoolState:
        return self._life.state

    @property
    def size(self) -> int:
        """Idle sandboxes the pool keeps warm."""
        return self._ledger.size

    @property
    def max_size(self) -> int:
        """Hard cap on sandboxes alive, being created or being stopped."""
        return self._ledger.max_size

    @property
    def reuse(self) -> bool:
        return self._options.reuse

    @property
    def options(self) -> PoolOptions:
        """The pool's settings as given (``size``/``max_size`` as at creation; see ``resize``)."""
        return self._options

    def statistics(self) -> PoolStatistics:
        """A frozen snapshot of the pool's gauges and counters."""
        ledger, creator = self._ledger, self._creator
        return PoolStatistics(
            state=self._life.state,
            size=ledger.size,
            max_size=ledger.max_size,
            idle=len(ledger.idle),
            leased=len(ledger.out),
            warming=ledger.warming,
            waiting=len(ledger.waiters),
            destroying=ledger.destroying,
            created=creator.created,
            destroyed=self._disposal.destroyed,
            failures=creator.failures,
            retries=creator.retries,
            warm_hits=ledger.warm_hits,
            cold_waits=ledger.cold_waits,
            timeouts=ledger.timeouts,
            discarded=ledger.discarded,
            max_alive=ledger.max_alive,
            create_limit=self._pacer.limit,
            create_latency_seconds=self._pacer.latency,
            failure=self._life.failure,
        )

    def __repr__(self) -> str:
        s = self.statistics()
        return (
            f"<SandboxPool {s.state.value} size={s.size} max_size={s.max_size} "
            f"idle={s.idle} leased={s.leased} warming={s.warming} waiting={s.waiting}>"
        )

    # -- wiring ------------------------------------------------------------------------
    def _publish(self) -> None:
        if self._life.state is not PoolState.CLOSED:
            ledger = self._ledger
            self._source.metrics.pool_gauges(
                idle=len(ledger.idle), leased=len(ledger.out), warming=ledger.warming, pool_id=self.pool_id
            )

    def _can_create(self) -> bool:
        return self._life.state is PoolState.OPEN and self._source.is_open

    def _fail(self, exc: BaseException) -> None:
        """The background failed with ``exc`` (a bug): FAILED, and every waiter gets the error now."""
        self._life.fail(exc)
        self._ledger.fail_waiters(self._life.failed_error)

    def _deliver(self, sb: Sandbox) -> None:
        if not (self._life.state is PoolState.OPEN and self._ledger.place(sb)):
            self._disposal.discard_soon(sb)

    def _drop_idle(self, sb: Sandbox) -> None:
        """The sweep found an idle sandbox dead: discard it if it is still idle."""
        if self._ledger.remove_idle(sb):
            log.info("discarding a dead idle sandbox", sandbox_id=sb.sandbox_id)
            self._disposal.discard_soon(sb)

    def _timed_out(self, timeout: float) -> PoolTimeoutError:
        s = self.statistics()
        err = PoolTimeoutError(
            f"no sandbox could be leased within {timeout:g} s (idle={s.idle}, leased={s.leased}, "
            f"warming={s.warming}, waiting={s.waiting}, max_size={s.max_size})"
        )
        err.__cause__ = self._creator.last_error if self._creator.consecutive_failures else None
        err.__suppress_context__ = True  # as ``raise err from cause``
        return err

    # -- lifecycle ---------------------------------------------------------------------
    async def __aenter__(self) -> SandboxPool:
        check_transition(self._life.state, PoolState.OPEN)
        if not self._source.is_open:
            raise PoolError("the session is not open; open it first ('async with Session(...)')", infrastructure=False)
        self._life.to(PoolState.OPEN)  # first: a background that fails at once finds the pool open, and fails it
        daemons = [self._refill.run]
        if self._health.interval is not None:
            daemons.append(self._sweep)
        await self._background.start(functools.partial(self._source.start_background, closer=self.aclose), *daemons)
        opts = self._options
        log.debug("pool opened", pool_id=self.pool_id, size=opts.size, max_size=opts.cap, reuse=opts.reuse)
        self._ledger.notify()
        return self

    async def _sweep(self) -> None:
        await self._health.sweep(lambda: list(self._ledger.idle), self._drop_idle)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop leasing, let leases finish (``close_grace_seconds``), cancel the rest, destroy everything.

        Idempotent, and safe to call from any task: a second caller waits for the first.
        Shielded from cancellation, within one budget (``close_timeout_seconds``, see
        ``PoolOptions``) that never outlives the session's close or the caller's deadline.
        Never raises for a sandbox that fails to stop (``Sandbox.stop`` logs it); what the
        budget did not cover is left to the Session, which stops every sandbox it created.
        """
        if self._life.state is PoolState.NEW:
            self._life.to(PoolState.CLOSED)
            self._closed.set()
            return
        if self._life.state in (PoolState.CLOSING, PoolState.CLOSED):
            await self._closed.wait()
            return
        self._life.to(PoolState.CLOSING)
        self._source.remove_closer(self.aclose)
        self._ledger.fail_waiters(lambda: PoolClosedError("cannot lease from a closed pool", infrastructure=False))
        opts = self._options
        parts = (self._ledger, self._handout, self._disposal, self._background)
        seconds = opts.close_timeout_seconds or self._source.timeouts.close_seconds
        try:
            if not await wind_down(
                *parts, budget=self._source.close_budget, grace=opts.close_grace_seconds, seconds=seconds
            ):
                log.warning("pool close ran out of its budget", pool=repr(self))
        finally:  # reached however the close ends (a bug in it included): the pool is closed
            self._background.cancel()  # its background ends even when the budget ran out before stop()
            self._life.to(PoolState.CLOSED)
            self._closed.set()
            self._source.metrics.pool_closed(self.pool_id)
        log.debug("pool closed", pool_id=self.pool_id, created=self._creator.created)

    # -- leasing -----------------------------------------------------------------------
    def lease(self, timeout_seconds: float | None = None, *, hold_timeout_seconds: float | None = None) -> Lease:
        """``async with pool.lease() as sb:`` a ready sandbox, released when the block exits.

        Waits at most ``timeout_seconds`` (default ``lease_timeout_seconds``) for a
        sandbox, then raises ``PoolTimeoutError``. Raises ``PoolError`` (not open, or
        failed: chained to the failure) and ``PoolClosedError`` (closed, or closing while
        waiting), both ``infrastructure=False``, and ``SandboxCreationError`` if the pool
        cannot create sandboxes (see ``max_consecutive_failures``).

        The block is bounded by ``hold_timeout_seconds`` (default: the pool's, None =
        unbounded): past it the block is cancelled, the sandbox destroyed and
        ``SandboxTimeoutError`` (``infrastructure=False``) raised. This and the lease
        timeout are what keep a rollout bounded when nothing cancels it from outside
        (an ART rollout coroutine, say). However the block ends (return, exception,
        cancellation), the sandbox is released: destroyed and replaced by default,
        returned to the pool with ``reuse=True`` only after a clean exit and reset.
        """
        opts = self._options
        timeout = (
            opts.lease_timeout_seconds if timeout_seconds is None else seconds_arg(timeout_seconds, "timeout_seconds")
        )
        hold = (
            opts.hold_timeout_seconds
            if hold_timeout_seconds is None
            else seconds_arg(hold_timeout_seconds, "hold_timeout_seconds")
        )
        return Lease(self._handout, timeout, hold)

    # -- sizing ------------------------------------------------------------------------
    async def wait_ready(self, timeout_seconds: float | None = None) -> None:
        """Wait until the idle target is met (``size`` idle, or as many as ``max_size`` leaves room for).

        Raises ``SandboxCreationError`` if the pool is failing to create sandboxes,
        ``PoolTimeoutError`` after ``timeout_seconds`` (None: no deadline of its own;
        every create attempt has one), ``PoolClosedError``/``PoolError`` as ``lease`` does.
        """
        timeout = validate_timeout(timeout_seconds, "timeout_seconds", allow_none=True)
        self._life.check_open()
        with anyio.move_on_after(float("inf") if timeout is None else timeout):
            while True:
                changed = self._ledger.changed()
                self._life.check_open()
                if self._ledger.idle_target_met():
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
        self._life.check_open()
        new_max = self._ledger.max_size if max_size is None else count_arg(max_size, "max_size", 1)
        new_size = count_arg(size, "size", 0)
        if new_size > new_max:
            raise SandboxValidationError(f"size ({new_size}) must not exceed max_size ({new_max})")
        self._ledger.size, self._ledger.max_size = new_size, new_max
        self._pacer.set_ceiling(new_max)
        trimmed = self._ledger.trim_idle()
        self._ledger.notify()
        log.info("pool resized", pool_id=self.pool_id, size=new_size, max_size=new_max, trimmed=len(trimmed))
        await self._disposal.destroy_all(trimmed)
