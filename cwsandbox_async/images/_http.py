"""Retries and the registry's words: what every registry request shares.

A request that fails in a way that may pass (429, a 5xx, a connection error, a read that
stalled past its deadline) raises :class:`Retryable` inside an attempt; :func:`with_retries`
runs attempts with tenacity, waiting what ``Retry-After`` asks (capped) or an exponential
back-off with jitter, and turns the last failure into ``ImagePullError(infrastructure=True)``.
Anything else an attempt raises (an ``ImagePullError`` that is the caller's) ends it at once.
"""

from __future__ import annotations

import email.utils
import json
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt, wait_exponential_jitter

from .._errors import ImagePullError
from ._options import ImageOptions

__all__ = ["Retryable", "registry_words", "retry_after_seconds", "with_retries"]

T = TypeVar("T")


class Retryable(Exception):
    """A failure another attempt may not meet (internal: never leaves this package)."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """``Retry-After`` in seconds (it is either seconds or an HTTP date); None if absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def registry_words(status: int, body: bytes) -> str:
    """The registry's own account of an error (its ``errors`` JSON), else the start of the body."""
    try:
        errors = json.loads(body).get("errors")
        words = "; ".join(f"{e.get('code', '?')}: {e.get('message', '')}".strip() for e in errors)
    except (ValueError, AttributeError, TypeError):
        words = body[:200].decode("utf-8", "replace").strip()
    return f"HTTP {status}" + (f" ({words})" if words else "")


class _Wait:
    def __init__(self, options: ImageOptions) -> None:
        self._cap = options.max_backoff_seconds
        self._backoff = wait_exponential_jitter(multiplier=0.2, max=options.max_backoff_seconds, jitter=0.2)

    def __call__(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome is not None else None
        if isinstance(exc, Retryable) and exc.retry_after is not None:
            return min(exc.retry_after, self._cap)
        return float(self._backoff(state))


async def with_retries(options: ImageOptions, what: str, attempt: Callable[[], Awaitable[T]]) -> T:
    """Run ``attempt`` until it returns, retrying :class:`Retryable` up to ``options.attempts`` times.

    Raises ``ImagePullError(infrastructure=True)`` naming ``what`` and the last failure when the
    attempts are spent; other exceptions (and cancellation) propagate at once.
    """
    retrying = AsyncRetrying(
        stop=stop_after_attempt(max(1, options.attempts)),
        wait=_Wait(options),
        retry=retry_if_exception_type(Retryable),
        reraise=True,
    )
    try:
        async for attempt_state in retrying:
            with attempt_state:
                return await attempt()
    except Retryable as exc:
        raise ImagePullError(f"{what}: {exc} (after {options.attempts} attempts)", infrastructure=True) from exc
    raise AssertionError("unreachable: tenacity ends with a result or an exception")  # pragma: no cover
