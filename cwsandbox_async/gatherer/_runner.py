"""The gatherer's workers: pull an item, run it with its deadline, turn how it ended into an ``Outcome``.

One ``Runner`` per gatherer. Up to ``limit`` worker tasks share it; each pulls
the next item only when its previous one is done (so at most ``limit`` items
are in flight and the input is read lazily), and the first pull of each worker
starts the next worker, so a batch of 3 items starts 3 or 4 workers, not
``limit``. A finished outcome goes into the outcome stream (``as_completed``)
or straight into its slot of the result list (``gather``).
"""

from __future__ import annotations

import asyncio
import inspect
from types import CoroutineType
from typing import Any, Protocol

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectSendStream

from .._errors import SandboxTimeoutError, SandboxValidationError
from .._log import log
from ._feed import Feed, FeedFailed
from ._outcome import Outcome, OutcomeKind, classify_error, make_outcome

__all__ = ["OutcomeSink", "Runner", "Sender"]

Sender = MemoryObjectSendStream["Outcome[Any] | FeedFailed"]

_OK = OutcomeKind.OK
#: ``kind.value`` without the enum's property lookup, for the metrics sink.
_KIND_NAMES = {kind: kind.value for kind in OutcomeKind}


class OutcomeSink(Protocol):
    """Receives one event per outcome (``MetricsAggregator`` is one)."""

    def gather_outcome(self, kind: str, duration: float) -> None: ...


def _cancel_requested() -> bool:
    """True if someone asked to cancel the current task (as opposed to the work raising CancelledError itself)."""
    try:
        task = asyncio.current_task()
    except RuntimeError:
        return True
    return task is None or task.cancelling() > 0


class Runner:
    """State every worker of one gatherer shares. Everything runs on the event loop thread."""

    __slots__ = ("bar", "feed", "sink", "slots", "tg", "timeout")

    def __init__(
        self,
        feed: Feed,
        timeout: float | None,
        sink: OutcomeSink | None,
        bar: Any,
        slots: list[Outcome[Any] | None] | None = None,
    ) -> None:
        self.feed = feed
        self.timeout = timeout
        self.sink = sink
        self.bar = bar
        self.slots = slots  # gather(): outcomes are stored here by index instead of sent
        self.tg: anyio.abc.TaskGroup | None = None

    def start(self, tg: anyio.abc.TaskGroup, send: Sender | None) -> None:
        self.tg = tg
        self.feed.workers = 1
        tg.start_soon(self.worker, send)

    async def run_item(self, index: int, key: Any, item: Any) -> Outcome[Any]:
        """Run one item; every ``Exception`` becomes the outcome's error. Cancellation of the worker propagates."""
        start = anyio.current_time()
        scope: anyio.CancelScope | None = None
        error: BaseException
        try:
            aw = item() if callable(item) else item
            if type(aw) is not CoroutineType and not inspect.isawaitable(aw):
                raise SandboxValidationError(
                    f"item {index} is not an awaitable or a zero-argument callable returning one: {aw!r:.80}"
                )
            if self.timeout is None:
                return make_outcome(index, key, _OK, await aw, None, anyio.current_time() - start)
            scope = anyio.move_on_after(self.timeout)
            with scope:
                value = await aw
            if scope.cancel_called:
                raise SandboxTimeoutError(
                    f"item {index} did not finish within {self.timeout:g} s", infrastructure=False
                )
            return make_outcome(index, key, _OK, value, None, anyio.current_time() - start)
        except asyncio.CancelledError as exc:
            if _cancel_requested():
                raise
            kind, error = OutcomeKind.CANCELLED, exc  # the work was cancelled by someone else, not by us
        except Exception as exc:
            kind = OutcomeKind.TIMEOUT if scope is not None and scope.cancel_called else classify_error(exc)
            error = exc
        return make_outcome(index, key, kind, None, error, anyio.current_time() - start)

    async def worker(self, send: Sender | None) -> None:
        """Pull, run, deliver, until the input is exhausted or fails; start one more worker after the first pull."""
        feed = self.feed
        sink, bar = self.sink, self.bar
        try:
            spawned = False
            while True:
                pulled = feed.pull_sync() if feed.is_sync else await feed.pull_async()
                if pulled is None:
                    await self._input_done(send)
                    return
                index, key, item = pulled
                if not spawned:
                    spawned = True
                    if feed.workers < feed.limit and not feed.exhausted:
                        feed.workers += 1
                        assert self.tg is not None
                        self.tg.start_soon(self.worker, None if send is None else send.clone())
                n = feed.in_flight = feed.in_flight + 1
                if n > feed.max_in_flight:
                    feed.max_in_flight = n
                try:
                    outcome = await self.run_item(index, key, item)
                finally:
                    feed.in_flight -= 1
                feed.completed += 1
                if sink is not None:
                    self._emit(outcome)
                if bar is not None:
                    bar.update(1)
                if send is None:
                    self._store(outcome)
                    continue
                try:
                    try:
                        send.send_nowait(outcome)
                    except anyio.WouldBlock:
                        await send.send(outcome)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    return  # the consumer has gone; the block is exiting
        finally:
            if send is not None:
                send.close()

    async def _input_done(self, send: Sender | None) -> None:
        feed = self.feed
        if feed.error is None or feed.error_reported:
            return
        feed.error_reported = True
        if send is not None:
            await send.send(FeedFailed())  # the consumer raises it in order, after the outcomes before it
        else:
            assert self.tg is not None
            self.tg.cancel_scope.cancel()  # gather() raises it once the items in flight are cancelled

    def _store(self, outcome: Outcome[Any]) -> None:
        slots = self.slots
        assert slots is not None
        i = outcome.index
        if i < len(slots):
            slots[i] = outcome
        else:
            slots.extend([None] * (i - len(slots)))
            slots.append(outcome)

    def _emit(self, outcome: Outcome[Any]) -> None:
        assert self.sink is not None
        try:
            self.sink.gather_outcome(_KIND_NAMES[outcome.kind], outcome.duration)
        except Exception as exc:  # metrics must never fail the gather
            log.warning("metrics sink failed", error=repr(exc))
