"""The gatherer's input side: pull items lazily from an iterable, count what is in flight."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterable, AsyncIterator, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import anyio

from .._errors import SandboxValidationError
from .._log import log

__all__ = ["Feed", "FeedFailed", "GatherStatistics"]

#: One item taken from the input: its index, its key (the index unless given), the work.
_Pulled = tuple[int, Any, Any]


@dataclass(frozen=True, slots=True)
class GatherStatistics:
    """A snapshot of one gatherer's counters."""

    limit: int  #: most items allowed in flight
    pulled: int  #: items taken from the input so far
    in_flight: int  #: items running now
    max_in_flight: int  #: most items that ran at once
    completed: int  #: items finished (outcomes produced)
    workers: int  #: worker tasks started


class FeedFailed:
    """Sent through the outcome stream when reading the input raised (the error is on the Feed)."""

    __slots__ = ()


class Feed:
    """Shared by the workers of one gatherer. All access happens on the event loop thread.

    ``pull_sync``/``pull_async`` return ``(index, key, item)`` or None when the
    input is exhausted or failed (then ``error`` holds the input's exception).
    """

    __slots__ = (
        "_async_it",
        "_collection",
        "_it",
        "_lock",
        "completed",
        "error",
        "error_reported",
        "exhausted",
        "in_flight",
        "is_sync",
        "limit",
        "max_in_flight",
        "pulled",
        "total",
        "workers",
    )

    def __init__(self, work: object, limit: int) -> None:
        self.limit = limit
        self._it: Iterator[Any] | None = None
        self._async_it: AsyncIterator[Any] | None = None
        self._lock: anyio.Lock | None = None
        if isinstance(work, (str, bytes, bytearray)):
            raise SandboxValidationError(f"work must be an iterable of awaitables, not {type(work).__name__}")
        if inspect.isgenerator(work) and inspect.getgeneratorstate(work) == inspect.GEN_CLOSED:
            raise SandboxValidationError(
                "work is a generator that was already read to its end (a generator runs once; "
                "pass a list to run the same work again)"
            )
        if isinstance(work, Mapping):
            self._it = iter(work.items())
        elif isinstance(work, Iterable):
            self._it = iter(work)
        elif isinstance(work, AsyncIterable):
            self._async_it = aiter(work)
            self._lock = anyio.Lock()
        else:
            raise SandboxValidationError(
                f"work must be an iterable or async iterable of awaitables, got {type(work).__name__}"
            )
        self.is_sync = self._it is not None
        self._collection = isinstance(work, Collection)
        self.total = len(work) if isinstance(work, Collection) else None
        self.exhausted = False
        self.error: BaseException | None = None
        self.error_reported = False
        self.pulled = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.completed = 0
        self.workers = 0

    def _split(self, item: Any) -> _Pulled:
        index = self.pulled
        self.pulled = index + 1
        if type(item) is tuple:
            if len(item) == 2:
                return index, item[0], item[1]
            _close_coroutines(item)
            return index, index, _invalid(f"item {index} is a tuple of {len(item)}; a keyed item is (key, work)")
        return index, index, item

    def pull_sync(self) -> _Pulled | None:
        """The next item of a plain iterable, without a checkpoint (so workers ramp up before items run)."""
        if self.exhausted:
            return None
        assert self._it is not None
        try:
            return self._split(next(self._it))
        except StopIteration:
            return self._stop(None)
        except Exception as exc:  # the input's own failure
            return self._stop(exc)

    async def pull_async(self) -> _Pulled | None:
        """The next item of an async iterable; one reader at a time, since it may await between items."""
        assert self._lock is not None and self._async_it is not None
        async with self._lock:
            if self.exhausted:
                return None
            try:
                return self._split(await anext(self._async_it))
            except StopAsyncIteration:
                return self._stop(None)
            except Exception as exc:  # the input's own failure
                return self._stop(exc)

    def _stop(self, error: Exception | None) -> _Pulled | None:
        """The input is exhausted, or failed with ``error`` (reported once, after the outcomes before it)."""
        self.exhausted = True
        self.error = error
        return None

    def statistics(self) -> GatherStatistics:
        return GatherStatistics(
            self.limit, self.pulled, self.in_flight, self.max_in_flight, self.completed, self.workers
        )

    def close_unstarted(self) -> None:
        """After an early exit, close coroutine objects still unread in a collection (they would warn)."""
        if not self._collection or self.exhausted or self._it is None:
            return
        self.exhausted = True
        try:
            for item in self._it:
                _close_coroutines(item)
        except Exception as exc:  # a collection whose iterator fails while draining: nothing left to close
            log.debug("gather input failed while closing unstarted items", error=repr(exc))


def _close_coroutines(item: Any) -> None:
    for x in item if type(item) is tuple else (item,):
        if inspect.iscoroutine(x):
            x.close()


def _invalid(message: str) -> Any:
    """An item that fails with SandboxValidationError when run (so it becomes an ERROR outcome)."""

    async def fail() -> None:
        raise SandboxValidationError(message)

    return fail
