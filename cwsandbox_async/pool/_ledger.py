"""The pool's ledger: where each sandbox it owns is, who waits for one, and what happened so far.

Every sandbox the pool owns is in exactly one place: ``idle`` (warm, ready), ``out``
(leased, or being health-checked or reset), a creation slot (``warming``, held through
retries and back-off) or ``destroying``. Moves between them are synchronous, and a
creation slot is only taken while ``alive < max_size``. That sum is an upper bound on
what the backend holds for the pool, so ``max_size`` is a hard cap whatever the
interleaving of leases, failures, retries, resizes and cancellations.

Waiters queue FIFO; a ready sandbox is handed to the first one synchronously (moved to
``out`` before its task runs again). The ledger has no tasks and does no I/O: after each
change it calls ``on_change`` (the pool publishes gauges there) and wakes whoever waits
on ``changed()``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio

from .._types import SandboxStatus

if TYPE_CHECKING:
    from .._sandbox import Sandbox

__all__ = ["Ledger", "Waiter"]

_TERMINAL = frozenset({SandboxStatus.COMPLETED, SandboxStatus.FAILED})


class Waiter:
    """One lease queued for a sandbox: woken with either ``sandbox`` or ``error`` set."""

    __slots__ = ("error", "event", "sandbox")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.sandbox: Sandbox | None = None
        self.error: BaseException | None = None


class Ledger:
    """The pool's accounting (see the module docstring). ``size``/``max_size`` may change (resize)."""

    def __init__(self, size: int, max_size: int, on_change: Callable[[], None]) -> None:
        self.size = size
        self.max_size = max_size
        self.idle: deque[Sandbox] = deque()
        self.out: set[Sandbox] = set()
        self.warming = 0
        self.destroying = 0
        self.waiters: deque[Waiter] = deque()
        self.warm_hits = self.cold_waits = self.timeouts = self.discarded = self.max_alive = 0
        self._on_change = on_change
        self._changed: anyio.Event | None = None

    # -- counts ------------------------------------------------------------------
    @property
    def alive(self) -> int:
        """Sandboxes counted against ``max_size``."""
        return len(self.idle) + len(self.out) + self.warming + self.destroying

    def creations_wanted(self) -> int:
        """Creations to start now for the idle target plus queued leases, within ``max_size``."""
        wanted = self.size + len(self.waiters) - len(self.idle) - self.warming
        return max(0, min(wanted, self.max_size - self.alive))

    def idle_target_met(self) -> bool:
        """Whether ``size`` sandboxes are idle (or as many as ``max_size`` leaves room for)."""
        room = self.max_size - len(self.out) - self.destroying
        return len(self.idle) >= min(self.size, room)

    # -- change notification -------------------------------------------------------
    def changed(self) -> anyio.Event:
        """An event set by the next ``notify`` (take it before checking the condition you wait for)."""
        if self._changed is None:
            self._changed = anyio.Event()
        return self._changed

    def notify(self) -> None:
        """Record the high-water mark, call ``on_change``, wake whoever waits for a change."""
        self.max_alive = max(self.max_alive, self.alive)
        self._on_change()
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()

    async def until(self, done: Callable[[], bool]) -> None:
        """Return once ``done()`` is true (checked after every change). The caller bounds the wait."""
        while True:
            changed = self.changed()
            if done():
                return
            await changed.wait()

    # -- moves ---------------------------------------------------------------------
    def take_idle(self) -> Sandbox | None:
        """Move the oldest idle sandbox to ``out`` and return it (None if nothing is idle)."""
        if not self.idle:
            return None
        sb = self.idle.popleft()
        self.out.add(sb)
        self.notify()
        return sb

    def place(self, sb: Sandbox, *, front: bool = False) -> bool:
        """Place a ready sandbox that is in no set: to the first waiter, else idle.

        False (nothing changed) if it should be destroyed instead: it is dead, or the idle
        set is full, or keeping it would pass ``max_size``.
        """
        if sb.status in _TERMINAL:
            return False
        if self.waiters:
            waiter = self.waiters.popleft()
            waiter.sandbox = sb
            self.out.add(sb)
            waiter.event.set()
        elif len(self.idle) < self.size and self.alive < self.max_size:
            if front:
                self.idle.appendleft(sb)
            else:
                self.idle.append(sb)
        else:
            return False
        self.notify()
        return True

    def remove_idle(self, sb: Sandbox) -> bool:
        """Take a dead sandbox out of the idle set (counted as discarded); False if it is not idle any more."""
        if sb not in self.idle:
            return False
        self.idle.remove(sb)
        self.discarded += 1
        self.notify()
        return True

    def trim_idle(self) -> list[Sandbox]:
        """Take the idle sandboxes above ``size`` or above what ``max_size`` allows (oldest first)."""
        surplus = max(len(self.idle) - self.size, min(len(self.idle), self.alive - self.max_size))
        trimmed = [self.idle.popleft() for _ in range(max(0, surplus))]
        if trimmed:
            self.notify()
        return trimmed

    def take_all(self) -> list[Sandbox]:
        """Everything idle or out, removed (closing: the caller destroys them)."""
        victims = [*self.idle, *self.out]
        self.idle.clear()
        self.out.clear()
        self.notify()
        return victims

    # -- waiters -------------------------------------------------------------------
    def enqueue(self, *, front: bool) -> Waiter:
        """Queue a waiter (at the front when it keeps its turn after a dead sandbox)."""
        waiter = Waiter()
        if front:
            self.waiters.appendleft(waiter)
        else:
            self.waiters.append(waiter)
        self.notify()
        return waiter

    def abandon(self, waiter: Waiter) -> Sandbox | None:
        """A waiter gave up (cancelled or timed out): unqueue it, and return a sandbox handed to it meanwhile.

        The returned sandbox was moved back out of ``out``; the caller places or destroys it.
        """
        sb = waiter.sandbox
        if sb is not None:
            self.out.discard(sb)
        elif waiter in self.waiters:
            self.waiters.remove(waiter)
        self.notify()
        return sb

    def fail_waiters(self, make_error: Callable[[], BaseException]) -> None:
        """Wake every waiter with a fresh error each."""
        while self.waiters:
            waiter = self.waiters.popleft()
            waiter.error = make_error()
            waiter.event.set()
        self.notify()
