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
