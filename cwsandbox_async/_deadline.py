"""One place that puts a deadline on a backend call and translates what escapes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

from ._errors import SandboxError, SandboxTimeoutError, SandboxTransportError

__all__ = ["call_backend"]

T = TypeVar("T")


async def call_backend(
    what: str,
    seconds: float,
    fn: Callable[[], Awaitable[T]],
    *,
    sandbox_id: str | None = None,
) -> T:
    """Await ``fn()`` for at most ``seconds``.

    A missed deadline raises ``SandboxTimeoutError`` (an infrastructure failure).
    Anything a backend let escape that is not a ``SandboxError`` is wrapped in
    ``SandboxTransportError`` so no foreign exception reaches the caller.
    Cancellation passes through untouched.
    """
    try:
        with anyio.fail_after(seconds):
            return await fn()
    except SandboxError:
        raise
    except TimeoutError as exc:
        raise SandboxTimeoutError(
            f"{what} did not finish within {seconds:g} s", sandbox_id=sandbox_id, infrastructure=True
        ) from exc
    except Exception as exc:
        raise SandboxTransportError(f"{what} failed: {exc!r}", sandbox_id=sandbox_id) from exc
