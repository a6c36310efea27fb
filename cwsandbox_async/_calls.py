"""``call_backend``: one backend call under a deadline, and what its failures mean.

The only translation above the backend boundary is the deadline's own: a call
that misses it is ``SandboxTimeoutError(infrastructure=True)`` (the backend
stopped answering; the program under test cannot cause that, since a command's
own timeout is enforced by the backend and returned as a result). Everything
else is the backend's to translate (``backends/base.py``): a ``SandboxError``
passes through as raised, and any other exception is a bug in the backend. It
propagates unchanged, logged at ERROR, and is never relabelled as
infrastructure, so GRPO never silently drops a sample because of a ``KeyError``.
Cancellation passes through untouched.

A cleanup call (a destroy) passes ``budget``: it then runs shielded from its
caller's cancellation, bounded by ``min(seconds, the close deadline)``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, TypeVar

import anyio

from ._budget import CloseBudget
from ._errors import SandboxError, SandboxTimeoutError
from ._log import log

if TYPE_CHECKING:
    from .backends.base import Backend

__all__ = ["call_backend", "destroy"]

T = TypeVar("T")


async def call_backend(
    what: str,
    seconds: float,
    fn: Callable[[], Awaitable[T]],
    *,
    sandbox_id: str | None = None,
    budget: CloseBudget | None = None,
) -> T:
    """Await ``fn()`` for at most ``seconds`` (shielded, within ``budget``, if given); see the module docstring."""
    scope: AbstractContextManager[anyio.CancelScope]
    scope = anyio.move_on_after(seconds) if budget is None else budget.shielded(seconds)
    start = anyio.current_time()
    with scope:
        try:
            return await fn()
        except SandboxError:
            raise
        except Exception as exc:
            log.error(
                "backend bug: an exception outside the SandboxError tree",
                call=what,
                sandbox_id=sandbox_id,
                error=repr(exc),
            )
            raise
    if budget is not None and budget.deadline < start + seconds:
        limit = f"{max(budget.deadline - start, 0.0):.3g} s (the close deadline)"
    else:
        limit = f"{seconds:g} s"
    raise SandboxTimeoutError(f"{what} did not finish within {limit}", sandbox_id=sandbox_id, infrastructure=True)


async def destroy(backend: Backend, sandbox_id: str, *, seconds: float, budget: CloseBudget) -> None:
    """Destroy a sandbox as a cleanup step (shielded, within ``seconds`` and ``budget``); log and raise a failure."""
    try:
        await call_backend(
            "destroy", seconds, lambda: backend.destroy(sandbox_id), sandbox_id=sandbox_id, budget=budget
        )
    except SandboxError as exc:
        log.warning("sandbox destroy failed", sandbox_id=sandbox_id, error=repr(exc))
        raise
