"""The gatherer: run many items of work, bounded, and hand back outcomes as they complete.

```
async with as_completed(work, limit=128, timeout_seconds=30) as results:
    async for outcome in results:        # completion order
        ...
outcomes = await gather(work, limit=128)  # input order
```

Shape (structured concurrency, no async generator around a task group): the
context manager opens an anyio task group in the host task and hands back an
``OutcomeStream`` over a memory object stream. Up to ``limit`` worker tasks each
pull the next item from the shared input iterator, run it, and send its
``Outcome`` into the stream; a worker pulls a new item only when its previous
one finished, so at most ``limit`` items are in flight and the input is read
lazily. The ``async with`` body runs in the host task; leaving it (end of the
stream, ``break``, an exception, cancellation) cancels the workers and waits for
them before ``async with`` returns.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import sys
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Collection, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any, Generic, Protocol, TypeAlias, TypeVar, cast

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ._errors import SandboxError, SandboxTimeoutError, SandboxValidationError
from ._feed import Feed, FeedFailed, GatherStatistics
from ._log import log
from ._outcome import Outcome, OutcomeKind, classify_error
from ._validate import validate_timeout

__all__ = ["DEFAULT_LIMIT", "GatherStatistics", "OutcomeSink", "OutcomeStream", "Work", "as_completed", "gather"]

T = TypeVar("T")

#: Items in flight at once when ``limit`` is not given.
DEFAULT_LIMIT = 128

#: One item of work: an awaitable, or a zero-argument callable returning one (lazy: nothing runs until pulled).
Work: TypeAlias = "Awaitable[T] | Callable[[], Awaitable[T]]"
#: What ``as_completed``/``gather`` accept: items, ``(key, item)`` pairs, a mapping key -> item, or an async iterable.
WorkSource: TypeAlias = (
    "Iterable[Work[T]] | Iterable[tuple[Any, Work[T]]] | Mapping[Any, Work[T]] | AsyncIterable[Work[T]]"
)


class OutcomeSink(Protocol):
    """Receives one event per outcome (``MetricsAggregator`` is one)."""

    def gather_outcome(self, kind: str, duration: float) -> None: ...


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
            raise SandboxError("the outcome stream is closed: iterate inside the 'async with' block") from None
        if type(item) is FeedFailed:
            assert self._feed.error is not None
            raise self._feed.error
        return cast(Outcome[T], item)

    @property
    def statistics(self) -> GatherStatistics:
        """Counters for this gatherer so far (items pulled, in flight, completed...)."""
        return self._feed.statistics()


def _validate_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise SandboxValidationError(f"limit must be a positive int, got {limit!r}")
    return limit


def _cancel_requested() -> bool:
    """True if someone asked to cancel the current task (as opposed to the work raising CancelledError itself)."""
    try:
        task = asyncio.current_task()
    except RuntimeError:
        return True
    return task is None or task.cancelling() > 0


class _Runner:
    """Runs items for the workers; holds what every worker shares (no per-item allocation beyond the outcome)."""

    __slots__ = ("bar", "feed", "sink", "tg", "timeout")

    def __init__(self, feed: Feed, timeout: float | None, sink: OutcomeSink | None, bar: Any) -> None:
        self.feed = feed
        self.timeout = timeout
        self.sink = sink
        self.bar = bar
        self.tg: anyio.abc.TaskGroup | None = None

    async def run_item(self, index: int, key: Any, item: Any) -> Outcome[Any]:
        """Run one item; every ``Exception`` becomes the outcome's error. Cancellation of the worker propagates."""
        start = time.perf_counter()
        scope: anyio.CancelScope | None = None
        error: BaseException
        try:
            aw = item() if callable(item) else item
            if not inspect.isawaitable(aw):
                raise SandboxValidationError(
                    f"item {index} is not an awaitable or a zero-argument callable returning one: {aw!r:.80}"
                )
            if self.timeout is None:
                value = await aw
            else:
                scope = anyio.CancelScope(deadline=anyio.current_time() + self.timeout)
                with scope:
                    value = await aw
                if scope.cancel_called:
                    raise SandboxTimeoutError(
                        f"item {index} did not finish within {self.timeout:g} s", infrastructure=False
                    )
            return Outcome(index, key, OutcomeKind.OK, value, None, time.perf_counter() - start)
        except asyncio.CancelledError as exc:
            if _cancel_requested():
                raise
            kind, error = OutcomeKind.CANCELLED, exc  # the work was cancelled by someone else, not by us
        except Exception as exc:
            kind = OutcomeKind.TIMEOUT if scope is not None and scope.cancel_called else classify_error(exc)
            error = exc
        return Outcome(index, key, kind, None, error, time.perf_counter() - start)

    async def worker(self, send: MemoryObjectSendStream[Outcome[Any] | FeedFailed]) -> None:
        """Pull, run, send, until the input is exhausted; start one more worker after the first pull."""
        feed = self.feed
        with send:
            spawned = False
            while True:
                pulled = feed.pull_sync() if feed.is_sync else await feed.pull_async()
                if pulled is None:
                    if feed.error is not None and not feed.error_sent:
                        feed.error_sent = True
                        await send.send(FeedFailed())
                    return
                index, key, item = pulled
                if not spawned:
                    spawned = True
                    if feed.workers < feed.limit and not feed.exhausted:
                        feed.workers += 1
                        assert self.tg is not None
                        self.tg.start_soon(self.worker, send.clone())
                feed.started()
                try:
                    outcome = await self.run_item(index, key, item)
                finally:
                    feed.in_flight -= 1
                feed.completed += 1
                if self.sink is not None:
                    self._emit(outcome)
                if self.bar is not None:
                    self.bar.update(1)
                try:
                    try:
                        send.send_nowait(outcome)
                    except anyio.WouldBlock:
                        await send.send(outcome)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    return  # the consumer has gone; the block is exiting

    def _emit(self, outcome: Outcome[Any]) -> None:
        assert self.sink is not None
        try:
            self.sink.gather_outcome(outcome.kind, outcome.duration)
        except Exception as exc:  # metrics must never fail the gather
            log.warning("metrics sink failed", error=repr(exc))


def _progress_bar(progress: bool | None, total: int | None) -> Any:
    """A tqdm bar if asked for (``True``) or if stdout is a terminal (``None``) and tqdm is installed."""
    if progress is False:
        return None
    if progress is None:
        isatty = getattr(sys.stdout, "isatty", None)
        if isatty is None or not isatty():
            return None
    try:
        tqdm = importlib.import_module("tqdm").tqdm
    except ImportError:
        if progress:
            log.warning("progress=True needs tqdm (pip install tqdm); continuing without a progress bar")
        return None
    # In auto mode, only batches that take longer than a second show a bar, and it goes away when done.
    return tqdm(total=total, unit="item", delay=0.0 if progress else 1.0, leave=bool(progress), dynamic_ncols=True)


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
    ``progress``: ``True`` shows a tqdm bar, ``None`` shows one if stdout is a
    terminal (and the batch lasts over a second), ``False`` never.

    Leaving the block, however it happens, cancels the items still running and
    waits for them. Cancellation of the caller, and ``BaseException`` s raised by an
    item (``KeyboardInterrupt``, ``SystemExit``), propagate unchanged. Bad
    arguments raise ``SandboxValidationError`` on entering the block; an item that
    is not awaitable becomes an ``ERROR`` outcome holding one.
    """
    lim = _validate_limit(limit)
    timeout = validate_timeout(timeout_seconds, "timeout_seconds", allow_none=True)
    feed = Feed(work, lim)
    runner = _Runner(feed, timeout, metrics, _progress_bar(progress, feed.total))
    send, recv = anyio.create_memory_object_stream[Outcome[T] | FeedFailed](lim)
    body_exc: BaseException | None = None
    group_exc: BaseExceptionGroup[BaseException] | None = None
    try:
        async with anyio.create_task_group() as tg:
            runner.tg = tg
            feed.workers = 1
            tg.start_soon(runner.worker, send)
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
        feed.close_unstarted()
        if runner.bar is not None:
            runner.bar.close()
    if group_exc is not None:
        raise group_exc.exceptions[0] if len(group_exc.exceptions) == 1 else group_exc
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

    Never raises for an item's failure; raises what ``as_completed`` raises
    (bad arguments, an exception from the input iterator, cancellation).
    """
    total = feed_total(work)
    outcomes: list[Outcome[T] | None] = [None] * total if total is not None else []
    async with as_completed(
        work, limit=limit, timeout_seconds=timeout_seconds, metrics=metrics, progress=progress
    ) as results:
        async for outcome in results:
            i = outcome.index
            if i >= len(outcomes):
                outcomes.extend([None] * (i + 1 - len(outcomes)))
            outcomes[i] = outcome
    return [o for o in outcomes if o is not None]


def feed_total(work: object) -> int | None:
    """The number of items, if the input knows it without being read."""
    return len(work) if isinstance(work, Collection) and not isinstance(work, (str, bytes)) else None
