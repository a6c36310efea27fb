"""A penalty that survives overload (issue 37): an infinite loop scores 0.0 and a correct CPU-bound program
1.0 while the machine is overloaded, and each item ends within 10 times its timeout.

The overload of the issue: busy loops on the host at twice the cores, 12 busy sandboxes of the same session,
and a batch of 4 items (2 infinite loops, 2 correct programs needing about 0.5 s of CPU each) with a 3 s
timeout, run the way ``code_reward`` runs them (``run_item``, its settings). Each sandbox gets about a
twentieth of the machine, so a first run is starved (0.15 s of CPU in its 3 s); its retry runs with CPU
priority (``cpu_priority``: the sandbox's CPU weight raised over the others, ``backends/local/_priority``)
and a CPU budget of 3 s, so the loop spends its budget (0.0) and the correct program finishes (1.0) well
inside the retry's wall. Without the priority the retry is starved as well (a loop got 3 s of CPU in 21.7 s
of wall here) and the item ends ``starved``: None, masked by GRPO.

The wall bound is not a timing threshold: ``run_item`` enforces it (the item's wall budget, 10 x its
timeout, sizes the retry and cuts what has not reported), so it is asserted as it is.

Slow: it overloads the machine for about half a minute. Everything it starts is stopped however it ends
(the loops in a ``finally``, the sandboxes with their session), and the test checks that none is left.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack

import anyio
import pytest
from anyio.abc import Process
from guards import HANG_GUARD_SECONDS, LONG_SECONDS

from cwsandbox_async.integrations._item import ItemSettings, run_item
from cwsandbox_async.integrations._verdicts import CompletionVerdict, VerdictKind

from .conftest import host_processes_matching, local_session, requires_isolation, wait_until

pytestmark = [pytest.mark.slow, requires_isolation]

TIMEOUT = 3.0
#: What ``code_reward`` runs each item with at this timeout (``RewardCore``: the retry's wall 4 x the timeout).
SETTINGS = ItemSettings(timeout_seconds=TIMEOUT, python="python3", starved_retry_timeout_seconds=4 * TIMEOUT)
BUSY_SANDBOXES = 12
LOOP = "def add(a, b):\n    while True:\n        pass\n"
#: Correct, after about 0.5 s of CPU (more than a twentieth of a core gives it in 3 s).
CORRECT = (
    "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end:\n    pass\n"
    "def add(a, b):\n    return a + b\n"
)
TESTS = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n"
BATCH = (LOOP, CORRECT, LOOP, CORRECT)


def spinner(tag: str) -> str:
    """A busy program that says it is up first (``tag`` in its command line: found if it outlived the test)."""
    return f"print('up', flush=True)  # {tag}\nwhile True:\n    pass\n"


async def first_line(receive: Callable[[], Awaitable[bytes]]) -> bytes:
    """The first output of a spinner (its "up"), within the hang guard."""
    with anyio.fail_after(HANG_GUARD_SECONDS):
        return await receive()


async def test_under_overload_a_loop_scores_zero_and_a_correct_program_one_within_ten_timeouts(tag: str) -> None:
    loops: list[Process] = []
    verdicts: dict[int, CompletionVerdict] = {}
    walls: dict[int, float] = {}
    try:
        # the host's busy loops, in this process's cgroup (the parent of the backend's sandbox groups)
        for _ in range(2 * len(os.sched_getaffinity(0))):
            loops.append(await anyio.open_process([sys.executable, "-c", spinner(tag)], stderr=None))
        for p in loops:
            assert p.stdout is not None and (await first_line(p.stdout.receive)).startswith(b"up")
        async with local_session(tag) as session, AsyncExitStack() as busy:
            for _ in range(BUSY_SANDBOXES):
                sb = await session.sandbox()
                proc = await busy.enter_async_context(
                    sb.process(["python3", "-c", spinner(tag)], timeout_seconds=LONG_SECONDS)
                )
                assert (await first_line(proc.stdout.receive)).startswith(b"up")
            items = [await session.sandbox() for _ in BATCH]

            async def item(i: int) -> None:
                start = time.monotonic()
                verdicts[i] = await run_item(items[i], i, BATCH[i], TESTS, SETTINGS)
                walls[i] = time.monotonic() - start

            with anyio.fail_after(HANG_GUARD_SECONDS):
                async with anyio.create_task_group() as tg:
                    for i in range(len(BATCH)):
                        tg.start_soon(item, i)
    finally:
        for p in loops:
            p.kill()
        with anyio.move_on_after(HANG_GUARD_SECONDS, shield=True):
            for p in loops:
                await p.wait()
    seen = "\n".join(f"{i}: {walls[i]:.1f} s {verdicts[i]}" for i in sorted(verdicts))
    for i, code in enumerate(BATCH):
        v = verdicts[i]
        if code is LOOP:
            assert v.kind is VerdictKind.TIMEOUT and v.score == 0.0, seen
        else:
            assert v.kind is VerdictKind.PASSED and v.score == 1.0, seen
        assert walls[i] <= 10 * TIMEOUT, seen
    assert any(v.retries for v in verdicts.values()), seen  # the overload starved first runs: retries decided
    # nothing left: neither the host's loops nor a sandbox's process
    await wait_until(lambda: not host_processes_matching(tag.encode()))
