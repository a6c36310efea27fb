"""The local backend never blocks the event loop: registry files, cgroups, temp dirs and /proc go to threads.

asyncio's debug mode times every callback and logs "Executing <handle> took N seconds" for any
that runs longer than ``slow_callback_duration``: 48 create/stop cycles (the template's start
included) must not produce one over 20 ms. The test process's own heap is frozen first
(``gc.freeze``): a full collection of a big pytest process takes 75-95 ms by itself under load,
which is not the backend's doing; the collector's pauses are still recorded and shown on failure.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from typing import Any

import pytest

from .conftest import local_session, requires_isolation

pytestmark = requires_isolation

SLOW_CALLBACK_SECONDS = 0.02
CYCLES = 48


class _Slow(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("Executing"):
            self.messages.append(message)


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
async def test_create_and_stop_never_block_the_loop(tag: str, isolation: str) -> None:
    loop = asyncio.get_running_loop()
    slow, pauses = _Slow(), _GcPauses()
    logger = logging.getLogger("asyncio")
    logger.addHandler(slow)
    gc.callbacks.append(pauses)
    debug, threshold = loop.get_debug(), loop.slow_callback_duration
    gc.collect()
    gc.freeze()
    loop.set_debug(True)
    loop.slow_callback_duration = SLOW_CALLBACK_SECONDS
    try:
        async with local_session(tag, isolation) as s:
            for _ in range(CYCLES):
                sb = await s.sandbox()
                await sb.stop()
    finally:
        loop.set_debug(debug)
        loop.slow_callback_duration = threshold
        logger.removeHandler(slow)
        gc.callbacks.remove(pauses)
        gc.unfreeze()
    longest_gc = sorted(pauses.pauses, key=lambda p: -p[1])[:5]
    assert slow.messages == [], (
        f"{len(slow.messages)} callbacks over 20 ms, e.g. {slow.messages[:2]}; longest GC pauses: {longest_gc}"
    )
