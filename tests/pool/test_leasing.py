"""Leasing: warm hand-out and replacement, FIFO waiters, deadlines, cancellation at every step, health checks."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from cwsandbox_async import (
    PoolTimeoutError,
    SandboxPool,
    SandboxStatus,
    SandboxTimeoutError,
    Session,
)
from cwsandbox_async.testing import FakeBackend, Faults, Latency

from .conftest import make_backend, own_live, settle, tasks_now, wait_until


async def test_warm_lease_and_replacement(backend_name: str) -> None:
    backend = make_backend(backend_name, create_latency=Latency.constant(0.01))
    async with Session(backend=backend) as s:
        tasks0 = tasks_now()
        async with SandboxPool(s, size=2, max_size=4) as pool:
            await pool.wait_ready(timeout_seconds=30)
            assert pool.statistics().idle == 2
            async with pool.lease(timeout_seconds=30) as sb:
                result = await sb.exec(["echo", "hi"])
                assert result.stdout == "hi\n"
                first = sb.sandbox_id
            stats = pool.statistics()
            assert stats.warm_hits == 1 and stats.cold_waits == 0
            await pool.wait_ready(timeout_seconds=30)  # a replacement was warmed
            await wait_until(lambda: pool.statistics().destroying == 0)
            assert pool.statistics().idle == 2
            assert first not in {sb.sandbox_id for sb in s.sandboxes}  # fresh per lease: destroyed
            assert await own_live(s) == 2
        stats = pool.statistics()
        assert stats.created == stats.destroyed == 3
        assert await own_live(s) == 0
        assert s.sandboxes == []
        assert tasks_now() == tasks0


async def test_body_exception_propagates_unwrapped_and_sandbox_is_destroyed(backend_name: str) -> None:
    async with Session(backend=make_backend(backend_name)) as s, SandboxPool(s, size=1) as pool:
        with pytest.raises(ValueError, match="rollout bug"):
            async with pool.lease(timeout_seconds=30) as sb:
                raise ValueError("rollout bug")
        await wait_until(lambda: sb.status is SandboxStatus.COMPLETED)
        async with pool.lease(timeout_seconds=30) as sb2:
            assert sb2.sandbox_id != sb.sandbox_id
            assert (await sb2.exec(["true"])).ok
        await settle(pool)


async def test_cancelled_lease_body_destroys_sandbox() -> None:
    be = FakeBackend(seed=1)
    async with Session(backend=be) as s, SandboxPool(s, size=1) as pool:
        with anyio.move_on_after(0.05) as scope:
            async with pool.lease() as sb:
                await anyio.sleep(30)
        assert scope.cancelled_caught
        await wait_until(lambda: sb.sandbox_id not in be.world)
        assert sb.status is SandboxStatus.COMPLETED


@pytest.mark.parametrize("reuse", [False, True])
async def test_sandbox_stopped_by_its_user_is_released_once(reuse: bool) -> None:
    be = FakeBackend(seed=1)
    async with Session(backend=be) as s, SandboxPool(s, size=1, reuse=reuse) as pool:
        async with pool.lease() as sb:
            await sb.stop()
        async with pool.lease() as sb2:
            assert sb2 is not sb and (await sb2.exec(["true"])).ok
    stats = pool.statistics()
    assert stats.created == stats.destroyed
    assert be.live == 0


async def test_fifo_order_of_waiters() -> None:
    be = FakeBackend(seed=2, create_latency=Latency.constant(0.002))
    order: list[int] = []
    async with Session(backend=be) as s, SandboxPool(s, size=0, max_size=1) as pool:
        holding, release = anyio.Event(), anyio.Event()

        async def holder() -> None:
            async with pool.lease(timeout_seconds=5):
                holding.set()
                await release.wait()

        async def waiter(i: int) -> None:
            async with pool.lease(timeout_seconds=10):
                order.append(i)

        async with anyio.create_task_group() as tg:
            tg.start_soon(holder)
            await holding.wait()
            for i in range(6):
                tg.start_soon(waiter, i)
                await wait_until(lambda n=i + 1: pool.statistics().waiting == n)  # type: ignore[misc]
            release.set()
        assert pool.statistics().cold_waits == 7
    assert order == list(range(6))
    assert be.max_live == 1 and be.live == 0


async def test_lease_deadline_raises_in_time() -> None:
    be = FakeBackend(create_latency=Latency.constant(600))  # a create that takes far too long
    async with Session(backend=be) as s:
        tasks0 = tasks_now()
        async with SandboxPool(s, size=0, max_size=1) as pool:
            start = anyio.current_time()
            with pytest.raises(PoolTimeoutError, match=r"within 20 s") as info:
                async with pool.lease(timeout_seconds=20):
                    pass
            assert anyio.current_time() - start == pytest.approx(20, abs=0.01)
            assert info.value.infrastructure  # the platform did not deliver in time
            stats = pool.statistics()
            assert stats.timeouts == 1 and stats.waiting == 0
        assert be.live == 0  # the create in flight was cancelled and cleaned up
        assert tasks_now() == tasks0


async def test_cancelled_waiter_leaves_nothing_behind() -> None:
    be = FakeBackend(create_latency=Latency.constant(0.1))
    async with Session(backend=be) as s, SandboxPool(s, size=0, max_size=2) as pool:
        with anyio.move_on_after(0.02):
            async with pool.lease():
                pytest.fail("no sandbox could have been ready")
        assert pool.statistics().waiting == 0
        # the create started for that waiter finishes, finds nobody, and is destroyed (size=0)
        await wait_until(lambda: pool.statistics().alive == 0 and be.live == 0)
        assert pool.statistics().created == 1


@pytest.mark.parametrize("how", ["asyncio", "anyio"])
async def test_sandbox_handed_to_a_waiter_cancelled_at_that_instant_is_not_lost(how: str) -> None:
    """The pool hands a sandbox to a waiter, and the waiter is cancelled before it runs again.

    With native asyncio cancellation (``task.cancel()``, as asyncio code such as an ART
    rollout gather does) the waiter's ``event.wait()`` raises even though the event
    was set; with an anyio scope the cancellation lands at its next checkpoint. Either
    way the sandbox must come back to the pool, not be lost.
    """
    be = FakeBackend(seed=3)
    got = []
    async with Session(backend=be) as s, SandboxPool(s, size=1, max_size=1, reuse=True) as pool:
        scope = anyio.CancelScope()

        async def waiter() -> None:
            with scope:
                async with pool.lease(timeout_seconds=10) as sb2:
                    got.append(sb2)

        task: asyncio.Task[None] | None = None
        async with anyio.create_task_group() as tg:
            async with pool.lease() as sb1:
                if how == "asyncio":
                    task = asyncio.ensure_future(waiter())
                else:
                    tg.start_soon(waiter)
                await wait_until(lambda: pool.statistics().waiting == 1)
            # leaving the lease handed sb1 to the waiter (reuse, no reset: synchronously);
            # cancel the waiter before it has run again
            if task is not None:
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                assert got == []
            else:
                scope.cancel()
        stats = pool.statistics()
        assert (stats.idle, stats.leased, stats.waiting) == (1, 0, 0)
        async with pool.lease() as sb3:
            assert sb3 is sb1
            assert (await sb3.exec(["true"])).ok
        assert be.created == 1
    assert be.live == 0


class SlowStatusBackend(FakeBackend):
    """A status call that takes time, as it does on a real backend."""

    async def status(self, sandbox_id: str) -> SandboxStatus:
        await anyio.sleep(0.2)
        return await super().status(sandbox_id)


async def test_lease_cancelled_during_its_health_check_returns_the_sandbox() -> None:
    be = SlowStatusBackend(seed=4)
    async with Session(backend=be) as s, SandboxPool(s, size=1, max_size=1) as pool:
        await pool.wait_ready(timeout_seconds=5)
        with anyio.move_on_after(0.05) as scope:
            async with pool.lease():
                pytest.fail("the health check takes 0.2 s")
        assert scope.cancelled_caught
        stats = pool.statistics()
        assert (stats.idle, stats.leased, stats.destroying) == (1, 0, 0)
        async with pool.lease(timeout_seconds=5) as sb:
            assert (await sb.exec(["true"])).ok
        assert be.created == 1  # the same sandbox, not a replacement
    assert be.live == 0


async def test_a_health_check_that_outlasts_the_lease_deadline_times_out_and_keeps_the_sandbox() -> None:
    be = SlowStatusBackend(seed=4)
    async with Session(backend=be) as s, SandboxPool(s, size=1, max_size=1) as pool:
        await pool.wait_ready(timeout_seconds=5)
        with pytest.raises(PoolTimeoutError):
            async with pool.lease(timeout_seconds=0.05):
                pytest.fail("the health check takes 0.2 s")
        assert pool.statistics().idle == 1 and pool.statistics().timeouts == 1
    assert be.created == 1 and be.live == 0


async def test_dead_idle_sandboxes_are_replaced_unseen() -> None:
    be = FakeBackend(seed=5, faults=Faults(idle_death=0.4))
    async with Session(backend=be) as s, SandboxPool(s, size=3, max_size=6) as pool:
        for _ in range(20):
            async with pool.lease(timeout_seconds=5) as sb:
                assert (await sb.exec(["true"])).ok
        assert pool.statistics().discarded > 0
    assert be.live == 0


async def test_health_sweep_replaces_idle_sandboxes_that_died() -> None:
    be = FakeBackend(seed=6)
    async with (
        Session(backend=be) as s,
        SandboxPool(s, size=3, check_on_lease=False, health_check_interval_seconds=0.02) as pool,
    ):
        await pool.wait_ready(timeout_seconds=5)
        for fake_sb in be.world.values():  # every idle sandbox dies (process gone, pod evicted)
            fake_sb.alive = False
        await wait_until(lambda: pool.statistics().discarded == 3 and pool.statistics().idle == 3)
        async with pool.lease() as sb:  # no check on lease: the sweep alone made this good
            assert (await sb.exec(["true"])).ok
    assert be.live == 0


async def test_hold_timeout_bounds_a_rollout() -> None:
    be = FakeBackend(seed=8)
    async with Session(backend=be) as s, SandboxPool(s, size=1) as pool:
        start = anyio.current_time()
        with pytest.raises(SandboxTimeoutError, match="hold_timeout_seconds") as info:
            async with pool.lease(hold_timeout_seconds=10) as sb:
                await anyio.sleep(3600)
        assert type(info.value) is SandboxTimeoutError
        assert not info.value.infrastructure
        assert anyio.current_time() - start == pytest.approx(10, abs=0.01)
        await wait_until(lambda: sb.sandbox_id not in be.world)


async def test_a_body_that_ends_within_its_hold_timeout_is_untouched() -> None:
    be = FakeBackend(seed=8)
    async with (
        Session(backend=be) as s,
        SandboxPool(s, size=1, max_size=1, reuse=True, hold_timeout_seconds=10) as pool,
    ):
        async with pool.lease() as sb:
            await anyio.sleep(9)
        async with pool.lease() as again:
            assert again is sb  # clean exit, reused
    assert be.created == 1
