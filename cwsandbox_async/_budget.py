"""Shielded cleanup that a close budget set above always bounds: ``CloseBudget``.

Cleanup (stopping a sandbox, closing a pool, destroying a half-created sandbox)
must run even when its caller is cancelled, so it runs in a shielded anyio
cancel scope. A shield also hides the deadlines of the scopes around it: a
shielded step with a 15 s budget inside a close that promised 1 s would take
15 s. So every shielded step of the library goes through the ``CloseBudget`` its
session owns::

    with budget.shielded(stop_seconds):     # a cleanup step: min(own budget, the close deadline)
        await backend.destroy(sandbox_id)

    with budget.closing(close_seconds):     # the close itself (Session.aclose)
        ...                                 # every step inside, and every one already running, ends by then

``closing`` sets the close deadline (only ever lowering it) and moves the deadline
of every shielded step already in progress to it, so a step that began before
the close (a lease release, a stop in another task) cannot outlive it either. A
step nested in another (a sandbox stop inside a pool's close, in the same task or
a task it started) never outlives the step around it either. A
step started after the budget has run out gets no time: its scope is cancelled
at its first await. Leaving a scope because its deadline passed is not an error:
the step's ``CancelScope.cancelled_caught`` says it was cut short and the caller
decides what to log.

One cancellation model: the library cancels only through anyio cancel scopes
(never ``task.cancel()``), so shields and deadlines compose as anyio defines.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import anyio

__all__ = ["CloseBudget"]

#: The deadline of the shielded step the current task runs in (inherited by the tasks it starts).
_enclosing: ContextVar[float] = ContextVar("cwsandbox_async_cleanup_deadline", default=math.inf)


class CloseBudget:
    """The deadline of one close, shared by every shielded cleanup step under it (one per ``Session``)."""

    __slots__ = ("_deadline", "_scopes")

    def __init__(self) -> None:
        self._deadline = math.inf
        self._scopes: set[anyio.CancelScope] = set()

    @property
    def deadline(self) -> float:
        """The close deadline on anyio's clock (``math.inf`` until a close starts)."""
        return self._deadline

    @property
    def active_steps(self) -> int:
        """Shielded steps in progress now."""
        return len(self._scopes)

    def limit(self, seconds: float) -> float:
        """Lower the close deadline to ``seconds`` from now (never raise it); every step in progress follows."""
        deadline = min(self._deadline, anyio.current_time() + seconds)
        self._deadline = deadline
        for scope in self._scopes:
            if scope.deadline > deadline:
                scope.deadline = deadline
        return deadline

    @contextmanager
    def shielded(self, seconds: float = math.inf, *, caller_bounds: bool = False) -> Iterator[anyio.CancelScope]:
        """A scope shielded from outside cancellation that ends by the earliest of: ``seconds`` from now,
        the close deadline, the deadline of any shielded step it runs in (in this task or a parent,
        so a nested step never outlives the step around it), and, with ``caller_bounds``, the
        caller's own effective deadline unless the caller is already cancelled.

        ``caller_bounds`` is for a close the caller may bound (``with move_on_after(2): await
        pool.aclose()`` ends by 2 s). A release or a stop leaves it off: the caller's deadline is
        about its own work, and cutting a destroy short because that deadline is near would leave
        the sandbox behind; a caller already cancelled still gets the full cleanup budget.
        """
        deadline = min(anyio.current_time() + seconds, self._deadline, _enclosing.get())
        if caller_bounds:
            caller = anyio.current_effective_deadline()
            if caller != -math.inf:  # -inf: the caller is being cancelled, and cleanup must still run
                deadline = min(deadline, caller)
        scope = anyio.CancelScope(shield=True, deadline=deadline)
        self._scopes.add(scope)
        token = _enclosing.set(deadline)
        try:
            with scope:
                yield scope
        finally:
            _enclosing.reset(token)
            self._scopes.discard(scope)

    @contextmanager
    def closing(self, seconds: float) -> Iterator[anyio.CancelScope]:
        """Start the close: set its deadline ``seconds`` from now (or the caller's, if sooner) and run the
        block shielded until then."""
        caller = anyio.current_effective_deadline()
        if caller != -math.inf:
            seconds = min(seconds, max(caller - anyio.current_time(), 0.0))
        self.limit(seconds)
        with self.shielded() as scope:
            yield scope
