"""The local backend's blocking work goes to worker threads, a few at a time (never on the event loop)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import anyio

__all__ = ["Blocking"]

#: Worker threads one backend's blocking work (registry files, cgroup directories, /proc reads) may
#: use at once: enough for concurrent creates; few enough that the process's thread count stays flat.
THREADS = 4
T = TypeVar("T")


class Blocking:
    """Runs a backend's blocking calls in worker threads (never on the event loop), ``THREADS`` at most."""

    def __init__(self) -> None:
        self._limiter = anyio.CapacityLimiter(THREADS)

    async def __call__(self, fn: Callable[..., T], *args: Any) -> T:
        return await anyio.to_thread.run_sync(fn, *args, limiter=self._limiter)
