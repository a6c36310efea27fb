"""Load: 10,000 executions at concurrency 256 on the local backend, nothing lost, duplicated or leaked.

256 execs are in flight at once over 32 warm sandboxes (eight at a time in each,
multiplexed over one agent channel), through the gatherer. Every item's output
must be its own (``echo i`` prints ``i``), each exactly once; afterwards the
driver's file descriptors, child processes, asyncio tasks and threads are back
to their baseline and no sandbox is left in the registry. On the 2-core machine
this was measured on, the 10,000 execs take about 7-10 s.

The 5-minute memory soak is outside the test run: ``python -m benchmarks.soak``
(``--quick`` for 30 s).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from collections.abc import Awaitable, Callable

import anyio
import pytest
from adversarial.conftest import bwrap_problem, descendants
from guards import HANG_GUARD_SECONDS

import cwsandbox_async as cwa
from cwsandbox_async.backends.local import LocalBackend

pytestmark = pytest.mark.skipif(bwrap_problem() is not None, reason=str(bwrap_problem()))

EXECS = 10_000
WARM_UP = 300
CONCURRENCY = 256
SANDBOXES = 32


def open_fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


async def settle(threads: int) -> None:
    """asyncio's subprocess watcher threads and anyio's worker threads wind down on their own."""
    with anyio.move_on_after(HANG_GUARD_SECONDS):
        while threading.active_count() > threads:  # noqa: ASYNC110 - threads offer no event
            await anyio.sleep(0.05)


async def run_load(tag: str, n: int) -> tuple[list[cwa.Outcome[str]], float, dict[str, int]]:
    async with cwa.Session(cwa.SandboxDefaults(tags=(tag,)), backend="local", handle_signals=False) as s:
        created = await cwa.gather([s.sandbox for _ in range(SANDBOXES)], limit=16)
        boxes = [o.unwrap() for o in created]

        def item(i: int) -> Callable[[], Awaitable[str]]:
            async def run() -> str:
                sb = boxes[i % SANDBOXES]
                if i % 10 == 0:  # one in ten through the warm-interpreter fast path
                    r = await sb.run_python(f"print({i})", timeout_seconds=HANG_GUARD_SECONDS)
                else:
                    r = await sb.exec(["echo", str(i)], timeout_seconds=HANG_GUARD_SECONDS)
                return r.stdout

            return run

        start = time.monotonic()
        outcomes = await cwa.gather({i: item(i) for i in range(n)}, limit=CONCURRENCY)
        elapsed = time.monotonic() - start
        stats = {k: sum(sb.exec_stats[k] for sb in boxes) for k in ("exec_count", "exec_completed_ok", "exec_failures")}
    return outcomes, elapsed, stats


#: The soak's hang guard: 10,000 execs take about a minute alone and several on a busy machine.
@pytest.mark.timeout(900)
async def test_ten_thousand_execs_at_concurrency_256_lose_nothing_and_leak_nothing() -> None:
    tag = f"load-{uuid.uuid4().hex[:8]}"
    threads = threading.active_count()
    _, warm_elapsed, _ = await run_load(tag, WARM_UP)  # the isolation probe, lazy imports, thread pools
    await settle(threads)
    fds, kids, tasks, threads = open_fds(), descendants(), len(asyncio.all_tasks()), threading.active_count()

    outcomes, elapsed, stats = await run_load(tag, EXECS)

    assert len(outcomes) == EXECS
    assert sorted(o.key for o in outcomes) == list(range(EXECS)), "an outcome was lost or duplicated"
    bad = [o for o in outcomes if not o.ok or o.value != f"{o.key}\n"]
    assert not bad, f"{len(bad)} wrong results, e.g. {bad[:3]}"
    assert stats == {"exec_count": EXECS, "exec_completed_ok": EXECS, "exec_failures": 0}
    # No exec costs more as the run grows (nothing kept per exec): per exec, the long run is not much
    # slower than the short warm-up measured just before on this machine (which also pays the warm-up).
    per_exec, warm_per_exec = elapsed / EXECS, warm_elapsed / WARM_UP
    assert per_exec < 4 * warm_per_exec, f"{EXECS} execs took {elapsed:.1f} s, {WARM_UP} took {warm_elapsed:.1f} s"
    await settle(threads)
    assert open_fds() == fds
    assert descendants() == kids
    assert len(asyncio.all_tasks()) == tasks
    assert threading.active_count() <= threads
    assert await LocalBackend().list([tag]) == []
