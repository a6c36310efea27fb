"""One place that puts a deadline on a backend call and translates what escapes.

The deadline is asyncio's own mechanism (what ``asyncio.timeout`` does: cancel the
task when it expires, ``uncancel`` it on the way out, so a cancellation from anyone
else still propagates), with the timers of all calls in flight on a loop coalesced:
the calls that share a duration expire in the order they started, so one bucket per
duration and one loop timer for the earliest deadline cover them all. Starting and
finishing a bounded call is a dict insert and delete instead of a ``TimerHandle``,
an anyio cancel scope and two task look-ups (about 1 µs instead of 8 µs); the
timer fires about once per deadline period while calls keep finishing in time.

Like ``asyncio.timeout`` (and unlike an anyio scope) the expiry cancels the task
once, natively: an anyio shield inside the backend call does not hold it off, and a
backend that swallows the ``CancelledError`` is not cancelled again.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Awaitable, Callable, Coroutine
from typing import TypeVar

import anyio

from ._errors import SandboxError, SandboxTimeoutError, SandboxTransportError

__all__ = ["backend_error", "bounded", "call_backend", "cancel_scope", "within"]

T = TypeVar("T")

#: Distinct durations tracked at once per loop; calls with other durations get a timer each.
MAX_BUCKETS = 64

_current_task = asyncio.current_task
_running_loop = asyncio.get_running_loop


_scope_class: type[anyio.CancelScope] | None = None


def cancel_scope(*, deadline: float = math.inf, shield: bool = False) -> anyio.CancelScope:
    """``anyio.CancelScope(deadline=..., shield=...)`` without the per-call event loop look-up.

    ``anyio.CancelScope(...)`` asks sniffio which async library runs (about 1.3 µs)
    and builds that backend's scope class; this builds the same class directly, found
    on the first call. The library runs on asyncio only, so the class never changes.
    """
    global _scope_class
    cls = _scope_class
    if cls is None:
        scope = anyio.CancelScope(deadline=deadline, shield=shield)
        _scope_class = type(scope)
        return scope
    return cls(deadline=deadline, shield=shield)


#: A bounded call in flight, keyed by a token in its bucket: the task to cancel, and when.
_Entry = tuple[asyncio.Task[object], float]
_tokens = itertools.count()


def _expire(calls: dict[int, _Entry], token: int) -> None:
    """Cancel one call unless it has finished (its own timer: see ``MAX_BUCKETS``)."""
    entry = calls.pop(token, None)
    if entry is not None:
        entry[0].cancel()


class _Deadlines:
    """The bounded calls in flight on one loop, bucketed by duration (each bucket is in deadline order)."""

    __slots__ = ("buckets", "handle", "handle_when", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.buckets: dict[float, dict[int, _Entry]] = {}
        self.handle: asyncio.TimerHandle | None = None
        self.handle_when = math.inf

    def arm(self, when: float) -> None:
        if self.handle is not None:
            self.handle.cancel()
        self.handle_when = when
        self.handle = self.loop.call_at(when, self.fire)

    def prune(self) -> bool:
        """Forget the buckets with no call in flight; True if any was."""
        empty = [seconds for seconds, bucket in self.buckets.items() if not bucket]
        for seconds in empty:
            del self.buckets[seconds]
        return bool(empty)

    def fire(self) -> None:
        """Cancel every call whose deadline has passed (removing it); re-arm for the earliest one left."""
        self.handle = None
        self.handle_when = math.inf
        now = self.loop.time()
        nearest = math.inf
        for seconds, bucket in list(self.buckets.items()):
            while bucket:
                token = next(iter(bucket))
                task, when = bucket[token]
                if when > now:
                    nearest = min(nearest, when)
                    break
                del bucket[token]
                task.cancel()
            if not bucket:
                del self.buckets[seconds]
        if nearest < math.inf:
            self.arm(nearest)


def _deadlines(loop: asyncio.AbstractEventLoop) -> _Deadlines | None:
    """The loop's registry (kept on the loop itself); None for a loop that takes no attribute of ours."""
    reg: _Deadlines | None = getattr(loop, "_cwsandbox_deadlines", None)
    if reg is None or reg.loop is not loop:
        reg = _Deadlines(loop)
        try:
            loop._cwsandbox_deadlines = reg  # type: ignore[attr-defined]
        except AttributeError:
            return None
    return reg


def _timeout_error(what: str, seconds: float, sandbox_id: str | None) -> SandboxTimeoutError:
    return SandboxTimeoutError(
        f"{what} did not finish within {seconds:g} s", sandbox_id=sandbox_id, infrastructure=True
    )


def _arm(
    loop: asyncio.AbstractEventLoop, task: asyncio.Task[object], seconds: float
) -> tuple[dict[int, _Entry], int, asyncio.TimerHandle | None]:
    """Register ``task`` to be cancelled in ``seconds``: (its bucket, its token, its own timer if it has one)."""
    when = loop.time() + seconds
    token = next(_tokens)
    reg = _deadlines(loop)
    calls = None if reg is None else reg.buckets.get(seconds)
    timer: asyncio.TimerHandle | None = None
    if reg is None or (calls is None and len(reg.buckets) >= MAX_BUCKETS and not reg.prune()):
        calls = {}  # too many distinct durations in flight (or no registry): a timer of its own
        timer = loop.call_at(when, _expire, calls, token)
    elif calls is None:
        calls = reg.buckets[seconds] = {}
    calls[token] = (task, when)
    if reg is not None and timer is None and when < reg.handle_when:
        reg.arm(when)
    return calls, token, timer


def _task(aw: Awaitable[object]) -> tuple[asyncio.AbstractEventLoop, asyncio.Task[object]]:
    loop = _running_loop()
    task = _current_task(loop)
    if task is None:  # not in a task (a bare callback): nothing to cancel, so no deadline can be kept
        if isinstance(aw, Coroutine):
            aw.close()
        raise RuntimeError("a deadline needs a task to cancel")
    return loop, task


async def within(seconds: float, aw: Awaitable[T]) -> T:
    """Await ``aw`` for at most ``seconds``, then cancel it and raise ``TimeoutError``.

    ``asyncio.timeout`` semantics (native cancellation, ``uncancel`` on the way out,
    a cancellation from anyone else propagates), on the shared timers of ``bounded``.
    """
    loop, task = _task(aw)
    cancelling = task.cancelling()
    calls, token, timer = _arm(loop, task, seconds)
    try:
        try:
            result = await aw
        finally:
            fired = calls.pop(token, None) is None  # the deadline took it out when it cancelled the task
            if timer is not None:
                timer.cancel()
    except asyncio.CancelledError as exc:
        if fired and task.uncancel() <= cancelling:
            raise TimeoutError(f"did not finish within {seconds:g} s") from exc
        raise
    except BaseException:
        if fired:  # the work swallowed our cancellation and failed otherwise
            task.uncancel()
        raise
    if fired:  # the work swallowed our cancellation and returned
        task.uncancel()
    return result


async def bounded(what: str, seconds: float, aw: Awaitable[T], *, sandbox_id: str | None = None) -> T:
    """Await ``aw`` (a backend call, already made) for at most ``seconds``; raise as ``call_backend`` says."""
    try:
        return await within(seconds, aw)
    except SandboxError:
        raise
    except Exception as exc:  # within's TimeoutError, or anything foreign the backend let escape
        raise backend_error(what, seconds, exc, sandbox_id) from exc


async def call_backend(
    what: str,
    seconds: float,
    fn: Callable[[], Awaitable[T]],
    *,
    sandbox_id: str | None = None,
) -> T:
    """Await ``fn()`` for at most ``seconds``.

    A missed deadline raises ``SandboxTimeoutError`` (an infrastructure failure).
    Anything a backend let escape that is not a ``SandboxError`` is wrapped in
    ``SandboxTransportError`` so no foreign exception reaches the caller.
    Cancellation passes through untouched.
    """
    try:
        aw = fn()
    except SandboxError:
        raise
    except Exception as exc:
        raise backend_error(what, seconds, exc, sandbox_id) from exc
    return await bounded(what, seconds, aw, sandbox_id=sandbox_id)


def backend_error(what: str, seconds: float, exc: Exception, sandbox_id: str | None) -> SandboxError:
    """The ``SandboxError`` to raise (``from exc``) for a foreign exception a backend call let escape."""
    if isinstance(exc, TimeoutError):
        return _timeout_error(what, seconds, sandbox_id)
    return SandboxTransportError(f"{what} failed: {exc!r}", sandbox_id=sandbox_id)
