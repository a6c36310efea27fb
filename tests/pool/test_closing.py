"""Closing: grace for held leases, then cancellation, everything destroyed, all within one budget."""

from __future__ import annotations

import anyio
import pytest
from guards import HANG_GUARD_SECONDS

from cwsandbox_async import PoolClosedError, PoolState, SandboxPool, SandboxStatus, Session, Timeouts
from cwsandbox_async.testing import FakeBackend, Faults, Latency

from .conftest import descendant_pids, make_backend, own_live, tasks_now, wait_until


async def test_close_lets_leases_finish_within_grace() -> None:
    be = FakeBackend(seed=15)
    done = []
    async with Session(backend=be) as s, SandboxPool(s, size=1, close_grace_seconds=5) as pool:
        entered = anyio.Event()

        async def rollout() -> None:
            async with pool.lease() as sb:
                entered.set()
                await anyio.sleep(4)
                done.append((await sb.exec(["echo", "done"])).stdout)

        async with anyio.create_task_group() as tg:
            tg.start_soon(rollout)
            await entered.wait()
            start = anyio.current_time()
            await pool.aclose()
            assert anyio.current_time() - start == pytest.approx(4, abs=0.05)
            assert done == ["done\n"]
    assert be.live == 0


async def test_close_cancels_leases_after_grace_and_fails_waiters(backend_name: str) -> None:
    errors: list[PoolClosedError] = []
    procs0 = descendant_pids()
    async with Session(backend=make_backend(backend_name)) as s:
        tasks0 = tasks_now()
        async with SandboxPool(s, size=1, max_size=1, close_grace_seconds=0.1) as pool:
            entered = anyio.Event()

            async def holder() -> None:
                try:
                    async with pool.lease():
                        entered.set()
                        await anyio.sleep(30)
                except PoolClosedError as exc:
                    errors.append(exc)

            async def waiter() -> None:
                try:
                    async with pool.lease(timeout_seconds=30):
                        pass
                except PoolClosedError as exc:
                    errors.append(exc)

            async with anyio.create_task_group() as tg:
                tg.start_soon(holder)
                await entered.wait()
                tg.start_soon(waiter)
                await wait_until(lambda: pool.statistics().waiting == 1)
                start = anyio.current_time()
                await pool.aclose()
                assert anyio.current_time() - start < 10
        messages = sorted(str(e) for e in errors)
        assert messages == ["cannot lease from a closed pool", "the pool closed while this lease was held"]
        assert not any(e.infrastructure for e in errors)  # the caller closed the pool
        assert await own_live(s) == 0 and s.sandboxes == []
        assert tasks_now() == tasks0
    await wait_until(lambda: descendant_pids() <= procs0)  # no sandbox process left behind


async def test_leaving_the_session_closes_its_pools() -> None:
    be = FakeBackend(seed=17)
    async with Session(backend=be) as s:
        pool = SandboxPool(s, size=2)
        await pool.__aenter__()  # not nested in its own block: the session must close it
        await pool.wait_ready(timeout_seconds=5)
        assert be.live == 2
    assert pool.state is PoolState.CLOSED
    assert be.live == 0
    await pool.__aexit__(None, None, None)  # already closed: nothing to do


async def _stubborn(pool: SandboxPool, entered: anyio.Event, held: list[str]) -> None:
    """A lease whose body ignores cancellation for an hour (a shielded wait in user code)."""
    async with pool.lease() as sb:
        held.append(sb.sandbox_id)
        entered.set()
        with anyio.CancelScope(shield=True):
            await anyio.sleep(3600)


async def test_close_takes_at_most_its_budget_even_when_a_lease_ignores_cancellation() -> None:
    be = FakeBackend(seed=18)
    held: list[str] = []
    async with Session(backend=be) as s:
        pool = SandboxPool(s, size=2, close_grace_seconds=1, close_timeout_seconds=5)
        async with pool, anyio.create_task_group() as tg:
            entered = anyio.Event()
            tg.start_soon(_stubborn, pool, entered, held)
            await entered.wait()
            start = anyio.current_time()
            await pool.aclose()
            assert anyio.current_time() - start <= 5 + 0.05
            assert pool.state is PoolState.CLOSED
            assert held[0] not in be.world  # its sandbox was destroyed under it, past the grace
            tg.cancel_scope.cancel()
    assert be.live == 0


async def test_an_enclosing_deadline_bounds_the_close_it_is_never_extended() -> None:
    """The pool's close never opens a budget of its own past the caller's: a deadline above holds."""
    be = FakeBackend(seed=19)
    held: list[str] = []
    async with Session(backend=be) as s:
        pool = SandboxPool(s, size=2, close_grace_seconds=30, close_timeout_seconds=60)
        async with pool, anyio.create_task_group() as tg:
            entered = anyio.Event()
            tg.start_soon(_stubborn, pool, entered, held)
            await entered.wait()
            start = anyio.current_time()
            with anyio.move_on_after(2):
                await pool.aclose()
            assert anyio.current_time() - start == pytest.approx(2, abs=0.05)
            tg.cancel_scope.cancel()
    assert be.live == 0  # what the pool's close left, the session stopped


async def test_a_cancelled_caller_still_closes_the_pool_within_its_budget() -> None:
    be = FakeBackend(seed=20, destroy_latency=Latency.constant(0.5))
    async with Session(backend=be) as s:
        pool = SandboxPool(s, size=3, close_timeout_seconds=10)
        with anyio.CancelScope() as scope:
            async with pool:
                await pool.wait_ready(timeout_seconds=HANG_GUARD_SECONDS)
                scope.cancel()  # the block is cancelled: its exit closes the pool anyway
                await anyio.sleep(1)
        assert pool.state is PoolState.CLOSED
        assert be.live == 0


async def test_a_lease_closing_its_own_pool_does_not_wait_out_the_grace() -> None:
    be = FakeBackend(seed=21)
    async with Session(backend=be) as s, SandboxPool(s, size=1, close_grace_seconds=30) as pool, pool.lease() as sb:
        start = anyio.current_time()
        await pool.aclose()
        assert anyio.current_time() - start < 1
        assert sb.status is SandboxStatus.COMPLETED
    assert be.live == 0


async def test_concurrent_closers_all_wait_for_the_first() -> None:
    be = FakeBackend(seed=22, destroy_latency=Latency.constant(1))
    async with Session(backend=be) as s:
        pool = SandboxPool(s, size=3)
        async with pool:
            await pool.wait_ready(timeout_seconds=HANG_GUARD_SECONDS)
            states: list[PoolState] = []

            async def close() -> None:
                await pool.aclose()
                states.append(pool.state)

            async with anyio.create_task_group() as tg:
                for _ in range(3):
                    tg.start_soon(close)
            assert states == [PoolState.CLOSED] * 3
        assert be.live == 0


async def test_a_hung_destroy_does_not_stretch_the_pools_close() -> None:
    """Each stop may take ``stop_seconds``, but never past the close's own budget (a nested shield re-opens nothing)."""
    be = FakeBackend(seed=23, faults=Faults(destroy_hang=1.0))
    async with Session(backend=be, timeouts=Timeouts(stop_seconds=30)) as s:
        pool = SandboxPool(s, size=2, close_timeout_seconds=5)
        async with pool:
            await pool.wait_ready()
            start = anyio.current_time()
        assert anyio.current_time() - start <= 5 + 0.05
        assert pool.state is PoolState.CLOSED


async def test_a_close_cut_short_by_its_caller_still_ends_the_pools_background() -> None:
    """The background's task group lives in the session's; a close that never reached its stop (the caller's
    deadline passed during the grace) still cancels it, so nothing of the pool keeps running."""
    be = FakeBackend(seed=22)
    async with Session(backend=be) as s:
        pool = SandboxPool(s, size=2, close_grace_seconds=30, health_check_interval_seconds=0.05)
        async with pool, anyio.create_task_group() as tg:
            entered = anyio.Event()
            tg.start_soon(_stubborn, pool, entered, [])
            await entered.wait()
            with anyio.move_on_after(0.5):
                await pool.aclose()
            await wait_until(lambda: not pool._background.running)
            tg.cancel_scope.cancel()
    assert be.live == 0
