"""The pool's background work: one long-lived task that owns one task group, opened and closed in one place.

A pool outlives the call that opens it (``await pool.__aenter__()``, then leases from
many tasks), so its background work (creations, destroys, resets, the health sweep)
cannot live in a task group of the caller's. It lives in a task group entered with
``async with`` inside ``_host``, the body of one asyncio task the pool starts and waits
for. Nothing cancels that task natively: ``stop()`` cancels the task group's own scope.

If background work raises (an unexpected exception is a bug), the task group cancels the
rest, ``_host`` catches the group once, reports it through ``on_failure`` (the pool moves
to FAILED there) and ends; ``spawn`` refuses new work from then on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
from anyio.abc import TaskGroup

from .._log import log

__all__ = ["Background"]


def _first(exc: BaseException) -> BaseException:
    """The first exception in (nested) task group errors: what the first task that failed raised."""
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


class Background:
    """A task group hosted by a task of its own; ``start`` / ``spawn`` / ``stop``."""

    def __init__(self, name: str, on_failure: Callable[[BaseException], None]) -> None:
        self._name = name
        self._on_failure = on_failure
        self._tg: TaskGroup | None = None
        self._task: asyncio.Task[None] | None = None  # a strong reference, so the task is not collected
        self._done = anyio.Event()
        self.failure: BaseException | None = None

    @property
    def running(self) -> bool:
        return self._tg is not None

    async def start(self, *daemons: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        """Start the host task with ``daemons`` running in its group; return once it accepts ``spawn``."""
        started = anyio.Event()
        self._task = asyncio.get_running_loop().create_task(self._host(started, daemons), name=self._name)
        await started.wait()

    async def _host(self, started: anyio.Event, daemons: tuple[Callable[[], Coroutine[Any, Any, Any]], ...]) -> None:
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                for daemon in daemons:
                    tg.start_soon(daemon, name=f"{self._name}: {getattr(daemon, '__name__', 'daemon')}")
                started.set()
                await anyio.sleep_forever()  # until stop() cancels the group, or a child fails
        except Exception as group:  # a bug in background work: reported once, the pool fails with it
            self.failure = _first(group)
            log.error("pool background work failed", error=repr(self.failure), errors=repr(group))
            self._on_failure(self.failure)
        finally:
            self._tg = None
            started.set()  # a failure before start() returned must not leave it waiting
            self._done.set()

    def spawn(self, fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any, name: str) -> bool:
        """Run ``fn(*args)`` in the group; False (nothing started) once it has stopped or failed."""
        tg = self._tg
        if tg is None:
            return False
        tg.start_soon(fn, *args, name=name)
        return True

    async def stop(self) -> None:
        """Cancel the group and wait for its task to end (the caller bounds the wait; a shielded
        stop of a sandbox in flight there ends by its own deadline)."""
        if self._task is None:
            return
        tg = self._tg
        if tg is not None:
            tg.cancel_scope.cancel()
        await self._done.wait()
