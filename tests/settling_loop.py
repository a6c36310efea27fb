"""The event loop the asyncio tests run on: it does not close while grpc still owes it a completion.

grpc.aio has one completion queue per process, polled by a thread of its own. Each operation
(a call's read, a server's wait for the next call) carries the event loop it was started on, and
its completion is handed to that loop from whichever loop reads grpc's notification socket next.
A test's loop closes when the test ends; an operation cancelled at its end (a call cancelled by
the channel's close, a server call cancelled by ``server.stop``) can complete a moment later, on a
busy machine after the loop is gone. The next test whose loop uses grpc then receives it, and
grpc's hand-off raises ``RuntimeError: Event loop is closed`` inside that test's loop: a failure
of the wrong test (CI saw one, in a README block that never touched the earlier test's objects).

So the loop's ``close`` first runs until grpc holds no operation of this loop any more. An
operation grpc still holds is a ``CallbackWrapper`` that grpc's C core keeps a reference to (its
reference count exceeds the referrers the garbage collector can see); once the core hands it back,
it is released. The wait ends on that fact, not on a clock; ``GRPC_SETTLE_GUARD_SECONDS`` only
stops a hang: past it, ``close`` raises, naming what was left, in the test that left it.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import sys
from typing import Any

# How long close() waits for grpc to hand back this loop's operations before it says what was left.
# Each is normally back within milliseconds of its cancel; only an object left open holds one longer.
GRPC_SETTLE_GUARD_SECONDS = 30.0


def _polled_by_grpc(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether grpc.aio bound this loop to its completion queue (a reader on grpc's socket)."""
    if "grpc" not in sys.modules:
        return False
    selector: Any = getattr(loop, "_selector", None)
    if selector is None:
        return False
    for key in list(selector.get_map().values()):
        reader = key.data[0] if isinstance(key.data, tuple) else None
        callback = getattr(reader, "_callback", None)
        if isinstance(callback, functools.partial):
            owner = getattr(callback.func, "__self__", None)
            if type(owner).__name__ == "PollerCompletionQueue":
                return True
    return False


def grpc_operations_held(loop: asyncio.AbstractEventLoop) -> int:
    """How many operations started on ``loop`` grpc's core still holds (their completion is owed)."""
    held = 0
    objects = gc.get_objects()
    try:
        for obj in objects:
            if type(obj).__name__ != "CallbackWrapper":
                continue
            futures = [r for r in gc.get_referents(obj) if isinstance(r, asyncio.Future)]
            if not futures or futures[0].get_loop() is not loop:
                continue
            # References: the core's own, plus those the collector sees (this list among them), plus
            # this frame's name and getrefcount's argument.
            if sys.getrefcount(obj) - 2 - len(gc.get_referrers(obj)) >= 1:
                held += 1
    finally:
        del objects
    return held


async def _grpc_settled(loop: asyncio.AbstractEventLoop) -> None:
    deadline = loop.time() + GRPC_SETTLE_GUARD_SECONDS
    while held := grpc_operations_held(loop):
        if loop.time() > deadline:
            raise RuntimeError(
                f"grpc still holds {held} operation(s) of this test's event loop "
                f"{GRPC_SETTLE_GUARD_SECONDS:.0f} s after the test: a grpc channel, call or server was "
                "left open, and its completion would land in a later test's loop"
            )
        await asyncio.sleep(0.01)


class SettlingEventLoop(asyncio.SelectorEventLoop):
    """asyncio's default loop, whose ``close`` first waits for grpc to hand back this loop's operations."""

    def close(self) -> None:
        if not self.is_closed() and not self.is_running() and _polled_by_grpc(self):
            self.run_until_complete(_grpc_settled(self))
        super().close()


# What an async test's ``anyio_backend`` returns: asyncio, on the loop above.
ASYNCIO: tuple[str, dict[str, Any]] = ("asyncio", {"loop_factory": SettlingEventLoop})
