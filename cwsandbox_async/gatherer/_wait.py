"""``wait(pending, num_returns=..., timeout=...)``: the CoreWeave SDK's ``cwsandbox.wait``, async.

Semantics kept from the SDK: returns ``(done, pending)`` lists of the objects
given; ``num_returns=None`` waits for all; at a timeout it returns what is done;
unfinished work is never cancelled; done items beyond ``num_returns`` are moved
to the front of ``pending``. Unlike the SDK, ``done`` is in completion order
(items already done when called come first, in input order), and no helper task
outlives the call.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import inspect
import math
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, cast

import anyio

from .._errors import SandboxValidationError
from .._process import Process
from .._sandbox import Sandbox

__all__ = ["wait"]

W = TypeVar("W")


def _is_done(w: object) -> bool:
    if isinstance(w, Sandbox):
        return True  # a Sandbox handle exists only once it is running (or has ended, which is also "done")
    if isinstance(w, Process):
        return w._done.is_set()
    assert isinstance(w, (asyncio.Future, concurrent.futures.Future))
    return w.done()


def _check(w: object, i: int) -> None:
    if isinstance(w, (Sandbox, Process, asyncio.Future, concurrent.futures.Future)):
        return
    if inspect.iscoroutine(w):
        raise SandboxValidationError(
            f"waitables[{i}] is a coroutine; wrap it in a task first (asyncio.create_task(coro)), "
            "so it runs, and so pending work is not lost"
        )
    raise SandboxValidationError(
        f"waitables[{i}] is a {type(w).__name__}; wait() takes tasks, futures, Sandbox and Process objects"
    )


def _on_future_done(mark: Callable[[int], None], i: int, _fut: object) -> None:
    mark(i)


async def _watch_process(proc: Process, on_done: Callable[[], None]) -> None:
    with contextlib.suppress(Exception):  # a failed process is done; its error is for whoever awaits it
        await proc.wait()
    on_done()


async def wait(
    waitables: Iterable[W],
    num_returns: int | None = None,
    timeout: float | None = None,  # noqa: ASYNC109  (the CoreWeave SDK's signature)
) -> tuple[list[W], list[W]]:
    """Wait until ``num_returns`` of ``waitables`` are done (all if None) or ``timeout`` passes.

    ``waitables`` are asyncio tasks and futures, ``concurrent.futures.Future``,
    ``Process`` (done when the command has ended) and ``Sandbox`` (always done:
    a handle exists only once its sandbox runs). Returns ``(done, pending)``
    holding the same objects; nothing is cancelled, and failed work counts as
    done (its error stays on it). ``timeout=0`` polls.

    Raises ``SandboxValidationError`` if ``num_returns`` is below 1, ``timeout``
    is negative, or a waitable is of another kind (a bare coroutine must be
    wrapped in a task first). Cancellation of the caller propagates (the
    waitables are left running).
    """
    items = list(waitables)
    if num_returns is not None and (
        isinstance(num_returns, bool) or not isinstance(num_returns, int) or num_returns < 1
    ):
        raise SandboxValidationError(f"num_returns must be at least 1, got {num_returns!r}")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or math.isnan(timeout) or timeout < 0
    ):
        raise SandboxValidationError(f"timeout must be None or a number of seconds >= 0, got {timeout!r}")
    for i, w in enumerate(items):
        _check(w, i)
    if not items:
        return [], []
    target = len(items) if num_returns is None else min(num_returns, len(items))
    order = [i for i, w in enumerate(items) if _is_done(w)]
    seen = set(order)
    if len(order) < target and timeout != 0:
        enough = anyio.Event()

        def mark(i: int) -> None:
            if i not in seen:
                seen.add(i)
                order.append(i)
                if len(order) >= target:
                    enough.set()

        callbacks: list[tuple[asyncio.Future[Any], Callable[[Any], None]]] = []
        try:
            async with anyio.create_task_group() as tg:
                for i, w in enumerate(items):
                    if i in seen:
                        continue
                    if isinstance(w, Process):
                        tg.start_soon(_watch_process, w, lambda i=i: mark(i))
                        continue
                    fut = asyncio.wrap_future(cast("asyncio.Future[Any] | concurrent.futures.Future[Any]", w))
                    cb = functools.partial(_on_future_done, mark, i)
                    fut.add_done_callback(cb)
                    callbacks.append((fut, cb))
                with anyio.move_on_after(timeout):
                    await enough.wait()
                tg.cancel_scope.cancel()  # stop the process watchers; the processes themselves go on
        finally:
            for registered, callback in callbacks:
                registered.remove_done_callback(callback)
    for i, w in enumerate(items):  # done since, with its callback not yet run
        if i not in seen and _is_done(w):
            seen.add(i)
            order.append(i)
    done = [items[i] for i in order[:target]]
    pending = [items[i] for i in order[target:]] + [items[i] for i in range(len(items)) if i not in seen]
    return done, pending
