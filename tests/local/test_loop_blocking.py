"""The local backend never blocks the event loop: registry files, cgroups, temp dirs and /proc go to threads.

Every callback the loop runs during 48 create/stop cycles (the template's start included) is
timed, in asyncio's debug mode. One that takes over 20 ms fails the test if in that time the loop's
thread either used 20 ms of CPU (work on the loop) or went to sleep in the kernel (a voluntary
context switch: a blocking read, wait, lock or GIL hand-off). A callback that was only *preempted*
(involuntary switches, little CPU: the machine's 2 cores busy with the sandboxes being born) is
reported but is not the backend's doing. The test process's own heap is frozen first
(``gc.freeze``): a full collection of a big pytest process takes 75-95 ms by itself under load,
which is not the backend's doing either; the collector's pauses are shown on failure.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable
from typing import Any

import pytest

from .conftest import local_session, requires_isolation

pytestmark = requires_isolation

SLOW_CALLBACK_SECONDS = 0.02
CYCLES = 48


def _switches() -> tuple[int, int]:
    """(voluntary, involuntary) context switches of the calling thread."""
    voluntary = involuntary = 0
    with open("/proc/thread-self/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                voluntary = int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches:"):
                involuntary = int(line.split()[1])
    return voluntary, involuntary


class _Timed:
    """Wraps ``asyncio.Handle._run``: every slow callback, and whether it blocked or was preempted."""

    def __init__(self, run: Callable[[asyncio.Handle], None]) -> None:
        self.inner = run
        self.blocked: list[str] = []
        self.preempted: list[str] = []

    def __call__(self, handle: asyncio.Handle) -> None:
        wall, cpu, (vol, invol) = time.perf_counter(), time.thread_time(), _switches()
        try:
            self.inner(handle)
        finally:
            wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
            if wall > SLOW_CALLBACK_SECONDS:
                vol2, invol2 = _switches()
                what = f"{handle!r:.160} took {wall * 1e3:.0f} ms (CPU {cpu * 1e3:.0f} ms)"
                if cpu > SLOW_CALLBACK_SECONDS or vol2 > vol:
                    self.blocked.append(f"{what}, {vol2 - vol} voluntary switches")
                else:
                    self.preempted.append(f"{what}, {invol2 - invol} involuntary switches")


class _GcPauses:
    def __init__(self) -> None:
        self.started = 0.0
        self.pauses: list[tuple[int, float]] = []

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self.started = time.perf_counter()
        else:
            self.pauses.append((int(info["generation"]), round(time.perf_counter() - self.started, 4)))


@pytest.mark.parametrize("isolation", ["auto", "plain"])
async def test_create_and_stop_never_block_the_loop(tag: str, isolation: str, monkeypatch: pytest.MonkeyPatch) -> None:
    loop = asyncio.get_running_loop()
    timed, pauses = _Timed(asyncio.Handle._run), _GcPauses()
    monkeypatch.setattr(asyncio.Handle, "_run", lambda handle: timed(handle))  # a function: binds the handle
    gc.callbacks.append(pauses)
    debug = loop.get_debug()
    gc.collect()
    gc.freeze()
    loop.set_debug(True)
    try:
        async with local_session(tag, isolation) as s:
            for _ in range(CYCLES):
                sb = await s.sandbox()
                await sb.stop()
    finally:
        loop.set_debug(debug)
        gc.callbacks.remove(pauses)
        gc.unfreeze()
    longest_gc = sorted(pauses.pauses, key=lambda p: -p[1])[:5]
    assert timed.blocked == [], (
        f"{len(timed.blocked)} callbacks blocked the loop over 20 ms, e.g. {timed.blocked[:2]}; "
        f"longest GC pauses: {longest_gc}; only preempted: {timed.preempted[:2]}"
    )
