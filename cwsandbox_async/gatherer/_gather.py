"""The gatherer: run many items of work, bounded, and hand back outcomes as they complete.

```
async with as_completed(work, limit=128, timeout_seconds=30) as results:
    async for outcome in results:        # completion order
        ...
outcomes = await gather(work, limit=128)  # input order
```

Shape (structured concurrency, no async generator around a task group): the
context manager opens an anyio task group in the host task and hands back an
``OutcomeStream`` over a memory object stream. Up to ``limit`` worker tasks
(``_runner``) each pull the next item from the shared input iterator, run it,
and send its ``Outcome`` into the stream; a worker pulls a new item only when
its previous one finished, so at most ``limit`` items are in flight and the
input is read lazily. The ``async with`` body runs in the host task; leaving it
(end of the stream, ``break``, an exception, cancellation) cancels the workers
and waits for them before ``async with`` returns. ``gather`` runs the same
workers without a stream: each outcome goes straight into its slot.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any, Generic, TypeAlias, TypeVar, cast

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

from .._errors import SandboxError
from .._log import log
from .._validate import validate_count, validate_timeout
from ._feed import Feed, FeedFailed, GatherStatistics
from ._outcome import Outcome
from ._runner import OutcomeSink, Runner

__all__ = [
    "DEFAULT_LIMIT",
    "GatherStatistics",
    "OutcomeSink",
    "OutcomeStream",
    "Work",
    "WorkSource",
    "as_completed",
    "gather",
]

T = TypeVar("T")

#: Items in flight at once when ``limit`` is not given.
DEFAULT_LIMIT = 128
#: In auto mode (``progress=None``) a bar appears only once a batch has run this long.
AUTO_BAR_DELAY_SECONDS = 1.0

#: One item of work: an awaitable, or a zero-argument callable returning one (lazy: nothing runs until pulled).
Work: TypeAlias = "Awaitable[T] | Callable[[], Awaitable[T]]"
#: What ``as_completed``/``gather`` accept: items, ``(key, item)`` pairs, a mapping key -> item, or an async iterable.
WorkSource: TypeAlias = (
    "Iterable[Work[T]] | Iterable[tuple[Any, Work[T]]] | Mapping[Any, Work[T]] | AsyncIterable[Work[T]]"
)


class OutcomeStream(Generic[T]):
    """Outcomes in completion order: ``async for outcome in results``.

    The iteration ends when every item has finished. If pulling the next item
    from the input raised, that exception is raised from the iteration (the
    items already running are cancelled when the ``async with`` block exits).
    Iterating after the block has exited raises ``SandboxError``.
    """

    __slots__ = ("_feed", "_recv")

    def __init__(self, recv: MemoryObjectReceiveStream[Outcome[T] | FeedFailed], feed: Feed) -> None:
        self._recv = recv
        self._feed = feed

    def __aiter__(self) -> OutcomeStream[T]:
        return self

    async def __anext__(self) -> Outcome[T]:
        recv = self._recv
        try:
            try:
                item = recv.receive_nowait()  # hot path: no loop round trip while outcomes are buffered
            except anyio.WouldBlock:
                item = await recv.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None
        except anyio.ClosedResourceError:
            raise SandboxError(  # the caller's mistake
                "the outcome stream is closed: iterate inside the 'async with' block", infrastructure=False
            ) from None
        if type(item) is FeedFailed:
            assert self._feed.error is not None
            raise self._feed.error
        return cast(Outcome[T], item)

    @property
    def statistics(self) -> GatherStatistics:
        """Counters for this gatherer so far (items pulled, in flight, completed...)."""
        return self._feed.statistics()


def _progress_bar(progress: bool | None, total: int | None) -> Any:
    """A tqdm bar on stderr: if asked for (``True``), or in auto mode (``None``) if stderr is a terminal.

    tqdm comes with the ``progress`` extra (``pip install 'cwsandbox-async[progress]'``);
    without it auto mode shows nothing and ``True`` warns once per call.
    """
    if progress is False:
        return None
    if progress is None:
        isatty = getattr(sys.stderr, "isatty", None)  # the bar is drawn on stderr, so that is the terminal that counts
        if isatty is None or not isatty():
            return None
    try:
        tqdm = importlib.import_module("tqdm").tqdm
    except ImportError:
        if progress:
            log.warning(
                "progress=True needs tqdm (pip install 'cwsandbox-async[progress]'); continuing without a progress bar"
            )
        return None
    # In auto mode, only batches that last longer than AUTO_BAR_DELAY_SECONDS show a bar, gone when done.
    delay = 0.0 if progress else AUTO_BAR_DELAY_SECONDS
    return tqdm(total=total, unit="item", delay=delay, leave=bool(progress), dynamic_ncols=True, file=sys.stderr)


@asynccontextmanager
async def as_completed(
    work: WorkSource[T],
    *,
    limit: int = DEFAULT_LIMIT,
    timeout_seconds: float | None = None,
    metrics: OutcomeSink | None = None,
    progress: bool | None = None,
) -> AsyncIterator[OutcomeStream[T]]:
    """Run ``work`` with at most ``limit`` items in flight; yield an ``OutcomeStream`` in completion order.

    ``work`` is an iterable (read lazily, one item per free slot) or async iterable
    of awaitables or zero-argument async callables; an item may be a ``(key, item)``
    pair, and a mapping is read as its ``(key, item)`` pairs. Prefer callables for
    large or lazy inputs: a coroutine object that is never awaited makes Python
    warn. On early exit, coroutine objects left unread in a collection (list,
    tuple, mapping) are closed; iterators and generators are left as they are.

    ``timeout_seconds`` is a per-item deadline: an item that misses it is cancelled
    and becomes a ``TIMEOUT`` outcome. Every ``Exception`` an item raises becomes
    its outcome's ``error``; one failing item never cancels the others.
    ``metrics.gather_outcome(kind, duration)`` is called per outcome.
    ``progress``: ``True`` shows a tqdm bar, ``None`` shows one if stderr is a
    terminal (and the batch lasts over a second), ``False`` never.

    Leaving the block, however it happens, cancels the items still running and
    waits for them. Cancellation of the caller, and ``BaseException`` s raised by an
    item (``KeyboardInterrupt``, ``SystemExit``), propagate unchanged. Bad
    arguments raise ``SandboxValidationError`` on entering the block; an item that
    is not awaitable becomes an ``ERROR`` outcome holding one.
    """
    feed, runner = _prepare(work, limit, timeout_seconds, metrics, progress, slots=None)
    send, recv = anyio.create_memory_object_stream[Outcome[T] | FeedFailed](feed.limit)
    body_exc: BaseException | None = None
    group_exc: BaseExceptionGroup[BaseException] | None = None
    try:
        async with anyio.create_task_group() as tg:
            runner.start(tg, send)
            try:
                yield OutcomeStream(recv, feed)
            except GeneratorExit:
                raise
            except BaseException as exc:
                # Keep the body's exception out of the task group, which would wrap it in a group;
                # it is re-raised unchanged once the workers are gone.
                body_exc = exc
            finally:
                tg.cancel_scope.cancel()
    except BaseExceptionGroup as exc:  # a worker let a BaseException through (KeyboardInterrupt, SystemExit...)
        group_exc = exc
    finally:
        send.close()
        recv.close()
        _finish(runner)
    if group_exc is not None:
        raise _single(group_exc)
    if body_exc is not None:
        raise body_exc


async def gather(
    work: WorkSource[T],
    *,
    limit: int = DEFAULT_LIMIT,
    timeout_seconds: float | None = None,
    metrics: OutcomeSink | None = None,
    progress: bool | None = None,
) -> list[Outcome[T]]:
    """Run ``work`` like ``as_completed`` and return every outcome in input order (errors as values).

    Never raises for an item's failure. Raises ``SandboxValidationError`` for bad
    arguments; if reading the input raises, the items in flight are cancelled
    and that exception is raised. Cancellation of the caller cancels every item,
    waits for them and propagates; so do ``BaseException`` s raised by an item.
    """
    slots: list[Outcome[Any] | None] = []
    feed, runner = _prepare(work, limit, timeout_seconds, metrics, progress, slots=slots)
    if feed.total is not None:
        slots.extend([None] * feed.total)
    group_exc: BaseExceptionGroup[BaseException] | None = None
    try:
        async with anyio.create_task_group() as tg:
            runner.start(tg, None)
    except BaseExceptionGroup as exc:  # a worker let a BaseException through (KeyboardInterrupt, SystemExit...)
        group_exc = exc
    finally:
        _finish(runner)
    if group_exc is not None:
        raise _single(group_exc)
    if feed.error is not None:
        raise feed.error
    return [cast(Outcome[T], o) for o in slots if o is not None]


def _prepare(
    work: object,
    limit: object,
    timeout_seconds: object,
    metrics: OutcomeSink | None,
    progress: bool | None,
    slots: list[Outcome[Any] | None] | None,
) -> tuple[Feed, Runner]:
    """Validate the arguments (``SandboxValidationError``) and build the feed and runner."""
    lim = validate_count(limit, "limit")
    timeout = validate_timeout(timeout_seconds, "timeout_seconds", allow_none=True)
    feed = Feed(work, lim)
    return feed, Runner(feed, timeout, metrics, _progress_bar(progress, feed.total), slots)


def _finish(runner: Runner) -> None:
    runner.feed.close_unstarted()
    if runner.bar is not None:
        runner.bar.close()


def _single(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """A lone exception out of its group, so ``except KeyboardInterrupt`` still works for the caller."""
    return group.exceptions[0] if len(group.exceptions) == 1 else group
