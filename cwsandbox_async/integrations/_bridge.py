"""Keep a Session (and its pool) alive across calls from code that does not own the event loop.

A ``SessionHost`` opens the Session and, if asked, a ``SandboxPool`` inside ONE
long-lived task, and closes them in that same task: sessions bind structlog
contextvars on open and reset them on close, which only works in one task, and
the session's shielded cleanup runs where it was opened.

Two ways to run that task:

- ``LoopThread``: for sync callers. One persistent event loop on a daemon thread
  (``anyio.from_thread.start_blocking_portal``), started once and reused by every
  call (never ``asyncio.run`` per call, which would kill pooled sandboxes); closed
  by ``close()`` or at interpreter exit.
- ``start_detached``: for async callers on a loop they do not own (TRL's
  ``GRPOTrainer-AsyncLoop`` thread). The host task runs in a task group its owner
  opened (a ``HostedTaskGroup``, as a Session opened with ``open()`` hosts its own:
  the owner is a reward function with no ``async with`` block) on first use, and
  lives until ``stop()``; the owner then closes the group.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import threading
import weakref
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.from_thread

from .._errors import SandboxError
from .._log import log
from .._tasks import HostedTaskGroup
from ..pool import SandboxPool

if TYPE_CHECKING:
    from .._session import Session

__all__ = ["HOST_CLOSE_TIMEOUT_SECONDS", "LoopThread", "SessionHost", "start_detached"]

T = TypeVar("T")

#: How long closing a host (session, pool, sandboxes) may take from another thread.
HOST_CLOSE_TIMEOUT_SECONDS = 90.0


class SessionHost:
    """Owns one Session and optional SandboxPool for as long as ``serve()`` runs.

    ``make_session`` builds the (unopened) Session; ``pool_size`` > 0 also opens a
    ``SandboxPool(session, size=pool_size, max_size=pool_max_size)``. ``serve``
    reports readiness through ``task_status.started()`` and returns once ``stop()``
    is called (from the host's own loop) or its task is cancelled; the session is
    closed on every exit path.
    """

    def __init__(
        self,
        make_session: Callable[[], Session],
        *,
        pool_size: int = 0,
        pool_max_size: int | None = None,
        pool_options: dict[str, Any] | None = None,
    ) -> None:
        self._make_session = make_session
        self._pool_size = pool_size
        self._pool_max_size = pool_max_size
        self._pool_options = dict(pool_options or {})
        self.session: Session | None = None
        self.pool: SandboxPool | None = None
        self._stop: anyio.Event | None = None

    async def serve(self, *, task_status: anyio.abc.TaskStatus[SessionHost] = anyio.TASK_STATUS_IGNORED) -> None:
        self._stop = anyio.Event()
        async with contextlib.AsyncExitStack() as stack:
            session = await stack.enter_async_context(self._make_session())
            self.session = session
            if self._pool_size > 0:
                pool = SandboxPool(session, size=self._pool_size, max_size=self._pool_max_size, **self._pool_options)
                self.pool = await stack.enter_async_context(pool)
            task_status.started(self)
            try:
                await self._stop.wait()
            finally:
                self.session = None
                self.pool = None
        log.debug("session host closed")

    def stop(self) -> None:
        """Ask ``serve`` to close everything and return. Call it on the host's loop."""
        if self._stop is not None:
            self._stop.set()


class LoopThread:
    """One persistent event loop on a daemon thread, for sync callers.

    ``call(fn, *args)`` runs ``await fn(*args)`` on that loop and blocks until it
    returns (or raises its exception). ``close()`` stops the hosted session, then
    the loop; it is idempotent and registered with ``atexit``.
    """

    def __init__(self, host: SessionHost, *, name: str = "cwsandbox-loop") -> None:
        self._lock = threading.Lock()
        self._closed = False
        self._cm = anyio.from_thread.start_blocking_portal(backend="asyncio", name=name)
        self._portal = self._cm.__enter__()
        try:
            self._host_future, _ = self._portal.start_task(host.serve, name="cwsandbox-session-host")
        except BaseException:
            self._cm.__exit__(None, None, None)
            raise
        self.host = host
        ref = weakref.ref(self)
        atexit.register(_close_ref, ref)

    @property
    def closed(self) -> bool:
        return self._closed

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``fn(*args)`` on the loop thread and return its result. Raises ``SandboxError`` once closed."""
        if self._closed:
            raise SandboxError("this sync bridge is closed", infrastructure=False)  # the caller's mistake
        return self._portal.call(fn, *args)

    def close(self, timeout_seconds: float = HOST_CLOSE_TIMEOUT_SECONDS) -> None:
        """Close the hosted session (every sandbox stopped) and the loop thread. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._portal.call(_stop_host, self.host)
            self._host_future.result(timeout=timeout_seconds)
        except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError, RuntimeError) as exc:
            log.warning("sync bridge close did not finish cleanly", error=repr(exc))
        except Exception as exc:
            log.warning("session host failed while closing", error=repr(exc))
        finally:
            with contextlib.suppress(Exception):
                self._cm.__exit__(None, None, None)


async def _stop_host(host: SessionHost) -> None:
    host.stop()


def _close_ref(ref: weakref.ref[LoopThread]) -> None:
    bridge = ref()
    if bridge is not None:
        bridge.close()


class _FutureStatus:
    """A ``TaskStatus`` that resolves an asyncio future (for a task started without a task group)."""

    def __init__(self, future: asyncio.Future[SessionHost]) -> None:
        self._future = future

    def started(self, value: SessionHost | None = None) -> None:
        if value is not None and not self._future.done():
            self._future.set_result(value)


async def start_detached(host: SessionHost, tasks: HostedTaskGroup) -> tuple[anyio.Event, asyncio.Future[SessionHost]]:
    """Start ``host.serve()`` in ``tasks`` (a task group its owner opened and closes); return an event
    set when it has ended, and its readiness.

    Await ``asyncio.shield(ready)`` to wait for the session (and pool) to open; it
    raises what opening them raised (the task is then finished). The task outlives
    the caller; stop it with ``host.stop()``, wait for the event, then close ``tasks``.
    asyncio only; must be called from a coroutine running on the loop.
    """
    ready: asyncio.Future[SessionHost] = asyncio.get_running_loop().create_future()
    ended = anyio.Event()

    async def run() -> None:
        try:
            await host.serve(task_status=_FutureStatus(ready))
        except Exception as exc:
            if not ready.done():
                ready.set_exception(exc)
            else:
                log.warning("session host failed", error=repr(exc))
        except BaseException:
            if not ready.done():
                ready.cancel()
            raise
        finally:
            ended.set()
            if not ready.done():
                # Ended without an error and without serving: a bug, not the platform's failure.
                ready.set_exception(SandboxError("session host ended before it was ready", infrastructure=False))

    (await tasks.open()).start_soon(run, name="cwsandbox-session-host")
    return ended, ready
