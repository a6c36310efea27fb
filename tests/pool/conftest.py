"""The pool suite's fixtures and helpers.

Tests on the FakeBackend run in virtual time (``looptime``'s event loop: time jumps to
the next timer whenever the loop is idle), so deadlines of seconds take milliseconds and
``anyio.current_time()`` is what they assert on. Tests parametrized over
``backend_name`` also run on the local backend (real processes, real time) when it can
create a sandbox here.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

import anyio
import looptime
import pytest
from guards import HANG_GUARD_SECONDS

from cwsandbox_async import SandboxBackendUnavailableError, SandboxPool, Session
from cwsandbox_async.testing import FakeBackend

#: Fast create retries for tests that make creation fail.
FAST = {"create_backoff_seconds": 0.01, "create_backoff_max_seconds": 0.05}


@pytest.fixture
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    """Virtual time, except for tests that run on the local backend (real processes need real time)."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and callspec.params.get("backend_name") == "local":
        return "asyncio"
    return ("asyncio", {"loop_factory": looptime.new_event_loop})


@pytest.fixture(params=["fake", "local"])
async def backend_name(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    if name == "local":
        try:
            async with Session(backend="local") as s, s.sandbox():
                pass
        except SandboxBackendUnavailableError as exc:
            pytest.skip(f"local backend not available: {exc}")
    return name


def make_backend(name: str, **fake_kw: Any) -> FakeBackend | str:
    return FakeBackend(seed=7, **fake_kw) if name == "fake" else name


async def wait_until(cond: Callable[[], bool], within: float = HANG_GUARD_SECONDS) -> None:
    """Poll ``cond`` (state owned by the pool or backend, which offer no event for it)."""
    with anyio.fail_after(within):
        while not cond():  # noqa: ASYNC110 - polling is the point
            await anyio.sleep(0.002)


def tasks_now() -> int:
    return len(asyncio.all_tasks())


async def own_live(session: Session) -> int:
    """Sandboxes of this session the backend still has (works on every backend)."""
    return sum(1 for info in await session.backend.list() if info.session_id == session.session_id)


async def settle(pool: SandboxPool) -> None:
    """Let refills finish before the pool closes, so no local create is cancelled mid-spawn.

    (A local create cancelled while its process is being spawned leaves asyncio pipe
    transports to the garbage collector, whose ResourceWarning would then fail whichever
    test happens to be running; the close-with-creates-in-flight path is covered on the
    FakeBackend.)
    """
    await pool.wait_ready(timeout_seconds=HANG_GUARD_SECONDS)
    await wait_until(lambda: pool.statistics().destroying == 0)


def descendant_pids() -> set[int]:
    """Live (non-zombie) processes descending from this one, from /proc."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            parents[int(entry)] = int(fields[1])
    found: set[int] = set()
    frontier = {os.getpid()}
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier} - found
        found |= frontier
    return found
