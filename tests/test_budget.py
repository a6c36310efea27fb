"""CloseBudget: shielded cleanup steps that a close deadline set above always bounds (virtual time)."""

from __future__ import annotations

import math
from typing import Any

import anyio
import looptime
import pytest

from cwsandbox_async._budget import CloseBudget


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return "asyncio", {"loop_factory": looptime.new_event_loop}


async def test_a_step_is_shielded_and_bounded_by_its_own_budget() -> None:
    budget = CloseBudget()
    start = anyio.current_time()
    with anyio.CancelScope() as outer:
        outer.cancel()  # the caller is cancelled: the step still runs, up to its own budget
        with budget.shielded(15) as step:
            await anyio.sleep(100)
    assert step.cancelled_caught and anyio.current_time() - start == pytest.approx(15)


async def test_a_nested_step_never_reopens_the_close_deadline() -> None:
    budget = CloseBudget()
    start = anyio.current_time()
    with budget.closing(1.0) as close:
        # a pool's close with its own, larger budget, and a sandbox stop inside it
        with budget.shielded(15), budget.shielded(30):
            await anyio.sleep(100)
        assert anyio.current_time() - start == pytest.approx(1.0)
        await anyio.sleep(1)  # the close block itself is out of time too
    assert close.cancelled_caught
    assert anyio.current_time() - start == pytest.approx(1.0)


async def test_a_step_already_running_when_the_close_starts_follows_its_deadline() -> None:
    budget = CloseBudget()
    ended: list[float] = []

    async def release() -> None:  # e.g. a lease release in another task, begun before the close
        with budget.shielded(15):
            await anyio.sleep(100)
        ended.append(anyio.current_time())

    start = anyio.current_time()
    async with anyio.create_task_group() as tg:
        tg.start_soon(release)
        await anyio.sleep(2)
        assert budget.active_steps == 1
        with budget.closing(0.5):
            await anyio.sleep(100)
    assert ended == [pytest.approx(start + 2.5)]
    assert budget.active_steps == 0


async def test_the_deadline_only_ever_goes_down() -> None:
    budget = CloseBudget()
    assert budget.deadline == math.inf
    first = budget.limit(1)
    assert budget.limit(60) == first == budget.deadline
    await anyio.sleep(5)
    start = anyio.current_time()
    with budget.shielded(10) as late:  # a step after the close ran out gets no time
        await anyio.sleep(1)
    assert late.cancelled_caught and anyio.current_time() == start


async def test_a_step_nested_in_another_never_outlives_it_even_in_a_child_task() -> None:
    """A pool's close step of 5 s; the stops inside it, in tasks it starts, have 30 s each: 5 s it is."""
    budget = CloseBudget()
    start = anyio.current_time()
    ended: list[float] = []

    async def stop() -> None:
        with budget.shielded(30):
            await anyio.sleep(100)
        ended.append(anyio.current_time() - start)

    with budget.shielded(5):
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(stop)
    assert ended == [pytest.approx(5)] * 3
    with budget.shielded(1):  # after a step, its bound is gone: the next one has its own
        pass
    with budget.shielded(2):
        await anyio.sleep(100)
    assert anyio.current_time() - start == pytest.approx(7)


async def test_the_callers_deadline_bounds_a_close_but_not_a_release() -> None:
    budget = CloseBudget()
    start = anyio.current_time()
    with anyio.move_on_after(2):
        with budget.shielded(60, caller_bounds=True):  # a close the caller bounds
            await anyio.sleep(100)
        closed = anyio.current_time() - start
        with budget.shielded(5):  # a release near the caller's deadline keeps its own budget
            await anyio.sleep(100)
    assert closed == pytest.approx(2)
    assert anyio.current_time() - start == pytest.approx(7)
    with anyio.CancelScope() as cancelled:
        cancelled.cancel()  # a caller already cancelled: the close still gets its budget
        with budget.shielded(3, caller_bounds=True):
            await anyio.sleep(100)
    assert anyio.current_time() - start == pytest.approx(10)


async def test_a_session_close_under_a_callers_deadline_ends_by_it() -> None:
    budget = CloseBudget()
    start = anyio.current_time()
    with anyio.move_on_after(1.5), budget.closing(60):
        await anyio.sleep(100)
    assert anyio.current_time() - start == pytest.approx(1.5)
    assert budget.deadline == pytest.approx(start + 1.5)
