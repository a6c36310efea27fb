"""How a pool creates sandboxes: a token bucket, retries with back-off, and failure streaks."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from .._errors import SandboxCreationError, SandboxError, SandboxValidationError
from .._log import log
from .._ratelimit import TokenBucket
from .._validate import validate_timeout

if TYPE_CHECKING:
    from .._sandbox import Sandbox
    from .._session import Session
    from .._types import SandboxDefaults

__all__ = ["Creator", "count_arg"]


def count_arg(value: object, what: str, minimum: int) -> int:
    """An int >= ``minimum`` (bools refused), else ``SandboxValidationError``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SandboxValidationError(f"{what} must be an int >= {minimum}, got {value!r}")
    return value


def _seconds(value: object, what: str) -> float:
    out = validate_timeout(value, what)
    assert out is not None
    return out


class Creator:
    """Creates one sandbox at a time for a pool, however many attempts it takes.

    Each attempt takes a token from the bucket (if a rate is set), then calls
    ``session.create_sandbox`` (which bounds the attempt by ``create_timeout_seconds``
    and destroys a half-created sandbox). A ``SandboxError`` is retried up to
    ``attempts`` times with ``wait_exponential_jitter``; each retry is logged and
    counted in ``session.metrics.retry("create")``. Validation errors, and any error
    once ``keep_going()`` is false, are not retried. Cancellation is never retried.

    ``max_failures`` failed attempts in a row make the creator *failing*: it calls
    ``on_failing()`` after that and every further failed attempt, until one succeeds.
    A creation that runs out of attempts sets a cool-down (``cooling_until``, doubling
    per exhausted creation up to ``backoff_max``) that the pool honours before it
    starts new ones.
    """

    def __init__(
        self,
        session: Session,
        defaults: SandboxDefaults,
        *,
        rate: float | None,
        burst: int | None,
        attempts: int,
        backoff: float,
        backoff_max: float,
        max_failures: int,
        keep_going: Callable[[], bool],
        on_failing: Callable[[], None],
    ) -> None:
        if rate is None and burst is not None:
            raise SandboxValidationError("create_burst needs create_rate")
        self.bucket = None if rate is None else TokenBucket(rate, burst)
        self._session = session
        self._defaults = defaults
        self._attempts = count_arg(attempts, "create_attempts", 1)
        self._backoff = _seconds(backoff, "create_backoff_seconds")
        self._backoff_max = _seconds(backoff_max, "create_backoff_max_seconds")
        self._max_failures = count_arg(max_failures, "max_consecutive_failures", 1)
        self._keep_going = keep_going
        self._on_failing = on_failing
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
        err = SandboxCreationError(
            f"the pool cannot create sandboxes: {self.consecutive_failures} attempts failed in a row; "
            f"last error: {self.last_error}",
            reason="pool_create_failing",
        )
        err.__cause__ = self.last_error
        return err

    async def create(self) -> Sandbox:
        """One ready sandbox; raises the last attempt's error when the retries run out."""
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
                    return await self._attempt()
        except Exception as exc:
            self._exhausted(exc)
            raise
        raise AssertionError("unreachable: tenacity re-raises the last error")

    async def _attempt(self) -> Sandbox:
        if self.bucket is not None:
            await self.bucket.acquire()
        try:
            sb = await self._session.create_sandbox(self._defaults)
        except Exception as exc:
            self.failures += 1
            self.consecutive_failures += 1
            self.last_error = exc
            if self.failing:
                self._on_failing()
            raise
        self.created += 1
        self.consecutive_failures = 0
        self._exhausted_streak = 0
        return sb

    def _retryable(self, exc: BaseException) -> bool:
        return isinstance(exc, SandboxError) and not isinstance(exc, SandboxValidationError) and self._keep_going()

    def _before_retry(self, rs: RetryCallState) -> None:
        self.retries += 1
        self._session.metrics.retry("create")
        exc = rs.outcome.exception() if rs.outcome is not None else None
        sleep = rs.next_action.sleep if rs.next_action is not None else 0.0
        log.info("retrying sandbox create", attempt=rs.attempt_number, sleep=round(sleep, 3), error=repr(exc))

    def _exhausted(self, exc: Exception) -> None:
        if not self._keep_going():
            return
        self._exhausted_streak += 1
        cool = min(self._backoff_max, self._backoff * 2 ** (self._exhausted_streak - 1))
        self.cooling_until = anyio.current_time() + cool
        log.warning(
            "pool could not create a sandbox", attempts=self._attempts, error=repr(exc), retry_in=round(cool, 3)
        )
