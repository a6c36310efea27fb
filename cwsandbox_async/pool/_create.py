"""How a pool creates one sandbox: paced attempts, retries with back-off, failure streaks and cool-downs."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import anyio
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from .._errors import SandboxCreationError, SandboxError, SandboxValidationError
from .._log import log
from ._pacing import Pacer

if TYPE_CHECKING:
    from .._sandbox import Sandbox
    from .._types import SandboxDefaults
    from ._options import PoolOptions

__all__ = ["Creator", "MakeSandbox"]

#: ``Session.create_sandbox``: one ready sandbox with these defaults, bounded by its create deadline.
MakeSandbox = Callable[["SandboxDefaults"], Awaitable["Sandbox"]]


class Creator:
    """Creates sandboxes for a pool, one ``create()`` per sandbox, however many attempts each takes.

    Each attempt waits for the pacer's rate limit (if any), then calls ``make(defaults)``
    (``Session.create_sandbox``: it bounds the attempt by ``create_timeout_seconds`` and
    destroys a half-created sandbox). A ``SandboxError`` is retried up to
    ``create_attempts`` times with ``wait_exponential_jitter``; each retry is logged and
    reported to ``on_retry``. Validation errors, and any error once ``keep_going()`` is
    false, are not retried; cancellation never is. Any other exception is a bug: it is
    not counted as a create failure and propagates unchanged (the pool fails with it).

    ``max_consecutive_failures`` failed attempts in a row make the creator *failing*: it
    calls ``on_failing()`` after that and every further failed attempt, until one
    succeeds. A creation that runs out of attempts sets a cool-down (``cooling_until``,
    doubling per exhausted creation up to ``create_backoff_max_seconds``) that the pool
    honours before it starts new ones.
    """

    def __init__(
        self,
        make: MakeSandbox,
        defaults: SandboxDefaults,
        options: PoolOptions,
        pacer: Pacer,
        *,
        keep_going: Callable[[], bool],
        on_failing: Callable[[], None],
        on_retry: Callable[[], None],
    ) -> None:
        self._make = make
        self._defaults = defaults
        self._pacer = pacer
        self._attempts = options.create_attempts
        self._backoff = options.create_backoff_seconds
        self._backoff_max = options.create_backoff_max_seconds
        self._max_failures = options.max_consecutive_failures
        self._keep_going = keep_going
        self._on_failing = on_failing
        self._on_retry = on_retry
        self.created = 0
        self.failures = 0
        self.retries = 0
        self.consecutive_failures = 0
        self.last_error: BaseException | None = None
        self.cooling_until = 0.0
        self._exhausted_streak = 0

    @property
    def failing(self) -> bool:
        return self.consecutive_failures >= self._max_failures

    def failing_error(self) -> SandboxCreationError:
        """A fresh error for one waiter, chained to the last creation error."""
        # Whose fault it is follows the cause: bad credentials or configuration stay the caller's,
        # and an exception outside the SandboxError tree is a bug, not the platform's failure.
        last = self.last_error
        err = SandboxCreationError(
            f"the pool cannot create sandboxes: {self.consecutive_failures} attempts failed in a row; "
            f"last error: {last}",
            reason="pool_create_failing",
            infrastructure=None if last is None else isinstance(last, SandboxError) and last.infrastructure,
        )
        err.__cause__ = last
        return err

    async def create(self, *, limited: bool) -> Sandbox:
        """One ready sandbox; raises the last attempt's ``SandboxError`` when the retries run out.

        ``limited``: whether the pacer's cap was what held creation back (see ``Pacer.succeeded``).
        """
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self._attempts),
            wait=wait_exponential_jitter(multiplier=self._backoff, max=self._backoff_max, jitter=self._backoff),
            retry=retry_if_exception(self._retryable),
            before_sleep=self._before_retry,
            sleep=anyio.sleep,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    return await self._attempt(limited)
        except SandboxError as exc:
            self._exhausted(exc)
            raise
        raise AssertionError("unreachable: tenacity re-raises the last error")

    async def _attempt(self, limited: bool) -> Sandbox:
        await self._pacer.ticket()
        started = anyio.current_time()
        try:
            sb = await self._make(self._defaults)
        except SandboxError as exc:
            self.failures += 1
            self.consecutive_failures += 1
            self.last_error = exc
            self._pacer.failed(started)
            if self.failing:
                self._on_failing()
            raise
        self._pacer.succeeded(started, anyio.current_time() - started, limited=limited)
        self.created += 1
        self.consecutive_failures = 0
        self._exhausted_streak = 0
        return sb

    def _retryable(self, exc: BaseException) -> bool:
        return isinstance(exc, SandboxError) and not isinstance(exc, SandboxValidationError) and self._keep_going()

    def _before_retry(self, rs: RetryCallState) -> None:
        self.retries += 1
        self._on_retry()
        exc = rs.outcome.exception() if rs.outcome is not None else None
        sleep = rs.next_action.sleep if rs.next_action is not None else 0.0
        log.info("retrying sandbox create", attempt=rs.attempt_number, sleep=round(sleep, 3), error=repr(exc))

    def _exhausted(self, exc: SandboxError) -> None:
        if not self._keep_going():
            return
        self._exhausted_streak += 1
        cool = min(self._backoff_max, self._backoff * 2 ** (self._exhausted_streak - 1))
        self.cooling_until = anyio.current_time() + cool
        log.warning(
            "pool could not create a sandbox", attempts=self._attempts, error=repr(exc), retry_in=round(cool, 3)
        )
