"""How a pool creates one sandbox: paced attempts, retries with back-off, failure streaks and cool-downs."""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import anyio
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from .._errors import SandboxCreationError, SandboxError
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
    destroys a half-created sandbox). An infrastructure ``SandboxError`` (the platform's
    failure) is retried up to ``create_attempts`` times with ``wait_exponential_jitter``;
    each retry is logged and reported to ``on_retry``. The caller's mistake
    (``infrastructure=False``: a validation error, a refused image or credentials) would
    fail the same way again: it is not retried, and the creator is *failing* at once, with
    that error as what the waiters get (``failing_error``). Nothing is retried once
    ``keep_going()`` is false; cancellation never is. Any other exception is a bug: it is
    not counted as a create failure and propagates unchanged (the pool fails with it).

    ``max_consecutive_failures`` infrastructure failures in a row make the creator
    *failing* too: it calls ``on_failing()`` after that and every further failed attempt,
    until one succeeds. A creation that fails for good sets a cool-down (``cooling_until``,
    doubling per such creation up to ``create_backoff_max_seconds``; the maximum at once for
    the caller's mistake) that the pool honours before it starts new ones.
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
        return self.consecutive_failures >= self._max_failures or _mistake(self.last_error)

    def failing_error(self) -> SandboxError:
        """A fresh error for one waiter: the caller's mistake as itself (same class and words), else a
        ``SandboxCreationError`` chained to the last creation error."""
        last = self.last_error
        if _mistake(last):
            assert isinstance(last, SandboxError)
            return _fresh(last)
        # Whose fault it is follows the cause: an exception outside the SandboxError tree is a bug,
        # not the platform's failure.
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
            self._exhausted(exc, retrying.statistics.get("attempt_number", 1))
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
        self.last_error = None
        self._exhausted_streak = 0
        return sb

    def _retryable(self, exc: BaseException) -> bool:
        return isinstance(exc, SandboxError) and not _mistake(exc) and self._keep_going()

    def _before_retry(self, rs: RetryCallState) -> None:
        self.retries += 1
        self._on_retry()
        exc = rs.outcome.exception() if rs.outcome is not None else None
        sleep = rs.next_action.sleep if rs.next_action is not None else 0.0
        log.info("retrying sandbox create", attempt=rs.attempt_number, sleep=round(sleep, 3), error=repr(exc))

    def _exhausted(self, exc: SandboxError, attempts: int) -> None:
        if not self._keep_going():
            return
        self._exhausted_streak += 1
        cool = min(self._backoff_max, self._backoff * 2 ** (self._exhausted_streak - 1))
        if _mistake(exc):
            cool = self._backoff_max  # it fails the same way until the caller changes something
        self.cooling_until = anyio.current_time() + cool
        log.warning("pool could not create a sandbox", attempts=attempts, error=repr(exc), retry_in=round(cool, 3))


def _mistake(exc: BaseException | None) -> bool:
    """Whether a create failed for the caller's mistake (``infrastructure=False``), which a retry repeats."""
    return isinstance(exc, SandboxError) and not exc.infrastructure


def _fresh(exc: SandboxError) -> SandboxError:
    """A copy of ``exc`` (class, words, attributes, cause) for one more waiter to raise, so waiters do not
    share one traceback; ``exc`` itself when its class cannot be rebuilt from its args."""
    try:
        twin = copy.copy(exc)
    except TypeError:
        return exc
    twin.__cause__, twin.__suppress_context__ = exc.__cause__, True
    return twin
