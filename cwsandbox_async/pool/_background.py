"""The pool's background work: one task group, hosted in a task group its owner (the Session) opened.

A pool outlives the call that opens it (``await pool.__aenter__()``, then leases from
many tasks), so its background work (creations, destroys, resets, the health sweep)
cannot live in a task group of the caller's. ``start`` hands ``_host`` to the owner
(``SandboxSource.start_background``), which starts it in the session's task group with
``TaskGroup.start``; ``_host`` opens the pool's own group with ``async with``, reports
readiness through ``task_status`` and holds the group until ``stop()`` cancels its
scope. Nothing is cancelled natively.

If background work raises (an unexpected exception is a bug), the task group cancels the
rest, ``_host`` catches the group once, reports it through ``on_failure`` (the pool moves
to FAILED there) and ends; ``spawn`` refuses new work from then on.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import anyio
from anyio.abc import TaskGroup, TaskStatus

from .._log import log

__all__ = ["Background", "StartTask"]

#: Starts a task that reports readiness (``task_status.started()``) in the owner's task group.
StartTask = Callable[[Callable[..., Coroutine[Any, Any, Any]], str], Awaitable[None]]


def _first(exc: BaseException) -> BaseException:
    """The first exception in (nested) task group errors: what the first task that failed raised."""
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


class Background:
    """The pool's task group, hosted by its owner; ``start`` / ``spawn`` / ``stop``."""

    def __init__(self, name: str, on_failure: Callable[[BaseException], None]) -> None:
        self._name = name
        self._on_failure = on_failure
        self._tg: TaskGroup | None = None
        self._started = False
        self._done = anyio.Event()
        self.failure: BaseException | None = None

    @property
    def running(self) -> bool:
        return self._tg is not None

    async def start(self, start_task: StartTask, *daemons: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        """Start the host in the owner's group (``start_task``) with ``daemons`` running in the pool's
        group; return once it accepts ``spawn`` (or has already failed)."""
        await start_task(functools.partial(self._host, daemons), self._name)
        self._started = True

    async def _host(
        self,
        daemons: tuple[Callable[[], Coroutine[Any, Any, Any]], ...],
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        ready = False
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                for daemon in daemons:
                    tg.start_soon(daemon, name=f"{self._name}: {getattr(daemon, '__name__', 'daemon')}")
                task_status.started()
                ready = True
                await anyio.sleep_forever()  # until stop() cancels the group, or a child fails
        except Exception as group:  # a bug in background work: reported once, the pool fails with it
            self.failure = _first(group)
            log.error("pool background work failed", error=repr(self.failure), errors=repr(group))
            self._on_failure(self.failure)
        finally:
            self._tg = None
            self._done.set()
            if not ready:
                task_status.started()  # a failure before start() returned must not leave it waiting

    def spawn(self, fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any, name: str) -> bool:
        """Run ``fn(*args)`` in the group; False (nothing started) once it has stopped or failed."""
        tg = self._tg
        if tg is None:
            return False
        tg.start_soon(fn, *args, name=name)
        return True

    def cancel(self) -> None:
        """Cancel the group without waiting (a close that ran out of budget still ends its background)."""
        tg = self._tg
        if tg is not None:
            tg.cancel_scope.cancel()

    async def stop(self) -> None:
        """Cancel the group and wait for its host to end (the caller bounds the wait; a shielded
        stop of a sandbox in flight there ends by its own deadline)."""
        if not self._started:
            return
        self.cancel()
        await self._done.wait()
