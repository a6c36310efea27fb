"""``HostedTaskGroup``: a task group for an owner that has no ``async with`` block to open one in.

Background work runs in a task group its owner opened. A ``Session`` entered with
``async with`` opens its group around the block. A session opened with ``open()`` and
closed with ``aclose()`` (perhaps from another task) has no such block, so its group is
hosted here: one task of its own that enters the group with ``async with``, holds it
open until ``aclose`` cancels it, and exits it in the same task, so the group's rules
hold (entered and exited in one task, one cancel scope). This is the one place the
library starts a task outside a task group.
"""

from __future__ import annotations

import asyncio

import anyio
from anyio.abc import TaskGroup

__all__ = ["HostedTaskGroup"]


class HostedTaskGroup:
    """A task group held open by a task of its own; ``open`` returns it, ``aclose`` ends it."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._tg: TaskGroup | None = None
        self._task: asyncio.Task[None] | None = None  # a strong reference, so the task is not collected
        self._done = anyio.Event()

    async def open(self) -> TaskGroup:
        """Start the host task (once) and return its group, open. Raises ``RuntimeError`` once closed."""
        if self._task is None:
            started = anyio.Event()
            self._task = asyncio.get_running_loop().create_task(self._host(started), name=self._name)
            await started.wait()
        if self._tg is None:
            raise RuntimeError(f"{self._name} is closed")
        return self._tg

    async def _host(self, started: anyio.Event) -> None:
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                started.set()
                await anyio.sleep_forever()  # until aclose() cancels the group
        finally:
            self._tg = None
            started.set()
            self._done.set()

    async def aclose(self) -> None:
        """Cancel the group and wait for its task to end (the caller bounds the wait). Idempotent."""
        if self._task is None:
            return
        if self._tg is not None:
            self._tg.cancel_scope.cancel()
        await self._done.wait()
