"""One close budget: a Session closes within ``Timeouts.close_seconds`` whatever is below it (virtual time).

Held leases, a pool, sandboxes whose destroy hangs, a backend whose own close
hangs: the close still returns by its bound, because every layer below runs
its cleanup under the session's ``CloseBudget`` instead of a budget of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import anyio
import looptime
import pytest
import structlog

import cwsandbox_async as cwa
from cwsandbox_async.testing import FakeBackend, Faults

BOUND = 2.0


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return "asyncio", {"loop_factory": looptime.new_event_loop}


class StuckBackend(FakeBackend):
    """Every destroy hangs (the sandbox lives on) and so does the backend's own close."""

    def __init__(self) -> None:
        super().__init__(faults=Faults(destroy_hang=1.0))
        self.close_started = False

    async def aclose(self) -> None:
        self.close_started = True
        await anyio.sleep_forever()


HOLDERS = 2


async def hold(pool: cwa.SandboxPool, held: list[str], all_held: anyio.Event) -> None:
    """A rollout that keeps its lease until the pool's close takes it back."""
    with contextlib.suppress(cwa.PoolClosedError):
        async with pool.lease() as sb:
            held.append(sb.sandbox_id)
            if len(held) == HOLDERS:
                all_held.set()
            await anyio.sleep_forever()


async def test_close_keeps_its_bound_with_held_leases_a_pool_and_a_stuck_backend() -> None:
    backend = StuckBackend()
    timeouts = cwa.Timeouts(close_seconds=BOUND, stop_seconds=30.0)  # one stop alone would take longer
    session = cwa.Session(backend=backend, handle_signals=False, timeouts=timeouts)
    await session.open()
    held: list[str] = []
    pool = cwa.SandboxPool(session, size=2, max_size=4, close_grace_seconds=10.0)
    async with pool, anyio.create_task_group() as tg:  # the session closes the pool from inside its block
        all_held = anyio.Event()
        for _ in range(HOLDERS):
            tg.start_soon(hold, pool, held, all_held)
        loose = [await session.sandbox() for _ in range(3)]  # hang on destroy too: left for a sweep
        await all_held.wait()
        with structlog.testing.capture_logs() as logs:
            start = anyio.current_time()
            await session.aclose()
            took = anyio.current_time() - start
        tg.cancel_scope.cancel()
    assert took <= BOUND + 0.01, f"a {BOUND} s close took {took:.2f} s"
    assert session.state.value == "closed"
    assert any(e["event"] == "session close hit its deadline" for e in logs)
    assert {sb.sandbox_id for sb in loose} <= backend.lost | {sb.sandbox_id for sb in session.sandboxes}
    assert session.close_budget.active_steps == 0
    assert pool.state is cwa.PoolState.CLOSED


async def test_a_close_that_has_time_stops_everything() -> None:
    """The same shape without the hang: everything is destroyed well within the bound."""
    backend = FakeBackend()
    session = cwa.Session(backend=backend, handle_signals=False, timeouts=cwa.Timeouts(close_seconds=BOUND))
    tasks_before = len(asyncio.all_tasks())
    await session.open()
    held: list[str] = []
    pool = cwa.SandboxPool(session, size=2, max_size=4, close_grace_seconds=0.5)
    async with pool, anyio.create_task_group() as tg:
        all_held = anyio.Event()
        for _ in range(HOLDERS):
            tg.start_soon(hold, pool, held, all_held)
        for _ in range(3):
            await session.sandbox()
        await all_held.wait()
        start = anyio.current_time()
        await session.aclose()
        took = anyio.current_time() - start
        tg.cancel_scope.cancel()
    assert took <= BOUND
    assert backend.live == 0 and backend.closed
    assert len(asyncio.all_tasks()) == tasks_before


class BuggyBackend(FakeBackend):
    """A backend with bugs: one destroy raises KeyError, its own close raises RuntimeError."""

    def __init__(self) -> None:
        super().__init__()
        self.broken: str | None = None

    async def destroy(self, sandbox_id: str) -> None:
        if sandbox_id == self.broken:
            raise KeyError(sandbox_id)
        await super().destroy(sandbox_id)

    async def aclose(self) -> None:
        raise RuntimeError("a bug in the backend's close")


async def test_a_bug_below_is_logged_at_error_and_the_close_still_releases_everything() -> None:
    backend = BuggyBackend()
    session = cwa.Session(backend=backend, handle_signals=False)
    await session.open()
    boxes = [await session.sandbox() for _ in range(4)]
    backend.broken = boxes[0].sandbox_id

    async def buggy_closer() -> None:
        raise ValueError("a bug in a pool's close")

    session.add_closer(buggy_closer)
    with structlog.testing.capture_logs() as logs:
        await session.aclose()  # does not raise: the close releases what it can and reports the bugs
    assert session.state.value == "closed"
    assert {sb.sandbox_id for sb in boxes[1:]}.isdisjoint(backend.world), "a bug stopped the other stops"
    errors = {e["event"] for e in logs if e["log_level"] == "error"}
    assert {"closing a pool failed with a bug", "closing the backend failed with a bug"} <= errors
    assert any("KeyError" in e.get("error", "") for e in logs if e["log_level"] == "error")
