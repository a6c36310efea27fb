"""SandboxPool: warming, leasing, FIFO, deadlines, the hard cap, failures, reuse, closing, no leaks.

Most tests run on the FakeBackend (seeded latency and faults, counts ``live`` and
``max_live``). The ones parametrized over ``backend_name`` also run on the local
backend when it can create a sandbox here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import random
import time
from collections.abc import Callable

import anyio
import pytest

from cwsandbox_async import (
    PoolClosedError,
    PoolError,
    PoolState,
    PoolStatistics,
    PoolTimeoutError,
    SandboxBackendUnavailableError,
    SandboxCreationError,
    SandboxPool,
    SandboxStatus,
    SandboxTimeoutError,
    SandboxValidationError,
    Session,
)
from cwsandbox_async._ratelimit import TokenBucket
from cwsandbox_async.metrics._aggregator import MetricsAggregator
from cwsandbox_async.testing import FakeBackend, Faults, Latency

FAST = {"create_backoff_seconds": 0.01, "create_backoff_max_seconds": 0.05}


async def wait_until(cond: Callable[[], bool], within: float = 5.0) -> None:
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
    await pool.wait_ready(timeout_seconds=60)
    await wait_until(lambda: pool.statistics().destroying == 0, 60)


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
    found, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier} - found
        found |= frontier
    return found


# -- backends ----------------------------------------------------------------------


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


def make_backend(name: str, **fake_kw: object) -> FakeBackend | str:
    return FakeBackend(seed=7, **fake_kw) if name == "fake" else name  # type: ignore[arg-type]


# -- the token bucket --------------------------------------------------------------


async def test_token_bucket_burst_then_rate() -> None:
    now = [0.0]

    async def fake_sleep(seconds: float) -> None:
        now[0] += seconds
        await anyio.lowlevel.checkpoint()

    bucket = TokenBucket(10, 2, clock=lambda: now[0], sleep=fake_sleep)
    for _ in range(5):
        await bucket.acquire()
    assert now[0] == pytest.approx(0.3)  # 2 from the burst, then 3 at 10/s
    assert not bucket.try_acquire()
    now[0] += 0.1
    assert bucket.try_acquire()
    now[0] += 100
    assert bucket.statistics().tokens == 2  # never more than the burst
    assert bucket.statistics().acquired == 6


async def test_token_bucket_cancelled_waiter_takes_no_token() -> None:
    bucket = TokenBucket(1, 1)
    await bucket.acquire()
    with anyio.move_on_after(0.05):
        await bucket.acquire()  # would wait ~1 s
    assert bucket.statistics().acquired == 1
    assert bucket.statistics().waiting == 0


@pytest.mark.parametrize(("rate", "burst"), [(0, None), (-1, None), (math.inf, None), (True, None), (1, 0), (1, 1.5)])
def test_token_bucket_validation(rate: float, burst: int | None) -> None:
    with pytest.raises(SandboxValidationError):
        TokenBucket(rate, burst)


# -- validation and lifecycle ------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"size": -1},
        {"size": 2, "max_size": 0},
        {"size": 5, "max_size": 4},
        {"size": 1.5},
        {"reset": lambda sb: None},  # reset without reuse
        {"create_rate": 0},
        {"create_burst": 3},  # burst without rate
        {"create_attempts": 0},
        {"lease_timeout_seconds": 0},
        {"close_grace_seconds": -1},
        {"health_check_interval_seconds": -1},
        {"bogus_option": 1},
    ],
)
async def test_bad_arguments_raise_validation_error(kwargs: dict[str, object]) -> None:
    async with Session(backend=FakeBackend()) as s:
        with pytest.raises(SandboxValidationError):
            SandboxPool(s, **kwargs)  # type: ignore[arg-type]


async def test_lifecycle_is_guarded() -> None:
    async with Session(backend=FakeBackend()) as s:
        pool = SandboxPool(s, size=1)
        assert pool.state is PoolState.NEW
        with pytest.raises(PoolError, match="not open"):
            async with pool.lease():
                pass
        async with pool:
            assert pool.state is PoolState.OPEN
            with pytest.raises(PoolError):
                await pool.__aenter__()
            with pytest.raises(SandboxValidationError):
                pool.lease(timeout_seconds=-1)
        assert pool.state is PoolState.CLOSED
        with pytest.raises(PoolClosedError, match="cannot lease from a closed pool"):
            async with pool.lease():
                pass
        with pytest.raises(PoolClosedError):
            async with pool:
                pass
        await pool.aclose()  # idempotent


async def test_pool_needs_an_open_session() -> None:
    s = Session(backend=FakeBackend())
    with pytest.raises(PoolError, match="session is not open"):
        async with SandboxPool(s, size=1):
            pass


# -- warming and leasing -----------------------------------------------------------


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
            await wait_until(lambda: pool.statistics().destroying == 0, 30)
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
        await wait_until(lambda: sb.status is SandboxStatus.COMPLETED, 30)
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
    be = FakeBackend(create_latency=Latency.constant(60))  # a create that takes far too long
    async with Session(backend=be) as s:
        tasks0 = tasks_now()
        async with SandboxPool(s, size=0, max_size=1) as pool:
            start = time.monotonic()
            with pytest.raises(PoolTimeoutError, match=r"within 0\.2 s"):
                async with pool.lease(timeout_seconds=0.2):
                    pass
            elapsed = time.monotonic() - start
            assert 0.2 <= elapsed < 5
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
    kw = {"check_on_lease": False, "health_check_interval_seconds": 0.02}
    async with Session(backend=be) as s, SandboxPool(s, size=3, **kw) as pool:  # type: ignore[arg-type]
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
        start = time.monotonic()
        with pytest.raises(SandboxTimeoutError, match="hold_timeout_seconds") as info:
            async with pool.lease(hold_timeout_seconds=0.1) as sb:
                await anyio.sleep(30)
        assert type(info.value) is SandboxTimeoutError
        assert not info.value.infrastructure
        assert time.monotonic() - start < 5
        await wait_until(lambda: sb.sandbox_id not in be.world)


# -- the hard cap ------------------------------------------------------------------


async def test_hard_cap_holds_under_random_leases_cancellations_failures_and_resizes() -> None:
    max_size = 5
    be = FakeBackend(
        seed=11,
        create_latency=Latency.uniform(0.001, 0.03),
        destroy_latency=Latency.uniform(0.0, 0.01),
        faults=Faults(create_failure=0.25, create_hang=0.03, idle_death=0.1),
    )
    rng = random.Random(3)
    outcomes = {"ok": 0, "cancelled": 0, "timeout": 0, "failing": 0}
    held: set[str] = set()
    async with Session(backend=be) as s:
        tasks0 = tasks_now()
        pool = SandboxPool(
            s,
            size=3,
            max_size=max_size,
            create_attempts=2,
            max_consecutive_failures=50,
            create_timeout_seconds=0.2,
            **FAST,  # type: ignore[arg-type]
        )
        async with pool:

            async def rollout() -> None:
                hold = rng.uniform(0, 0.03)
                cancel_after = rng.choice([math.inf, math.inf, rng.uniform(0, 0.06)])
                with anyio.move_on_after(cancel_after) as scope:
                    try:
                        async with pool.lease(timeout_seconds=3) as sb:
                            assert sb.sandbox_id not in held, "a sandbox leased twice at once"
                            held.add(sb.sandbox_id)
                            try:
                                assert (await sb.exec(["true"])).ok
                                await anyio.sleep(hold)
                            finally:
                                held.discard(sb.sandbox_id)
                        outcomes["ok"] += 1
                    except PoolTimeoutError:
                        outcomes["timeout"] += 1
                    except SandboxCreationError:
                        outcomes["failing"] += 1
                if scope.cancelled_caught:
                    outcomes["cancelled"] += 1

            async def monitor() -> None:
                while True:
                    assert be.live <= max_size
                    assert pool.statistics().alive <= max_size
                    await anyio.sleep(0.001)

            async def resizer() -> None:
                for n in (1, 5, 0, 3, 2):
                    await anyio.sleep(0.04)
                    await pool.resize(n)

            async with anyio.create_task_group() as outer:
                outer.start_soon(monitor)
                async with anyio.create_task_group() as work:
                    work.start_soon(resizer)
                    for _ in range(80):
                        work.start_soon(rollout)
                        await anyio.sleep(rng.uniform(0, 0.003))
                outer.cancel_scope.cancel()
        stats = pool.statistics()
        assert outcomes["ok"] > 20 and outcomes["cancelled"] > 0
        assert stats.failures > 0 and stats.retries > 0 and stats.discarded > 0
        assert stats.max_alive <= max_size
        assert be.max_live <= max_size
        assert be.live == 0 and s.sandboxes == []
        assert stats.created == stats.destroyed
        assert tasks_now() == tasks0


async def test_hard_cap_on_every_backend(backend_name: str) -> None:
    backend = make_backend(backend_name, create_latency=Latency.uniform(0.001, 0.02))
    peak = 0
    async with Session(backend=backend) as s:
        async with SandboxPool(s, size=2, max_size=3) as pool:

            async def rollout() -> None:
                nonlocal peak
                async with pool.lease(timeout_seconds=60) as sb:
                    peak = max(peak, await own_live(s))
                    assert (await sb.exec(["true"])).ok

            async with anyio.create_task_group() as tg:
                for _ in range(12):
                    tg.start_soon(rollout)
            await settle(pool)
        assert pool.statistics().max_alive <= 3
        assert peak <= 3
        assert await own_live(s) == 0


# -- failures ----------------------------------------------------------------------


async def test_persistent_create_failure_surfaces_then_recovers() -> None:
    be = FakeBackend(seed=9, faults=Faults(create_failure=1.0))
    async with Session(backend=be) as s:
        pool = SandboxPool(s, size=2, create_attempts=2, max_consecutive_failures=3, **FAST)  # type: ignore[arg-type]
        async with pool:
            start = time.monotonic()
            with pytest.raises(SandboxCreationError, match="attempts failed in a row") as info:
                async with pool.lease(timeout_seconds=30):
                    pass
            assert time.monotonic() - start < 5
            assert isinstance(info.value.__cause__, SandboxCreationError)  # the backend's own error
            with pytest.raises(SandboxCreationError):
                await pool.wait_ready(timeout_seconds=30)
            stats = pool.statistics()
            assert stats.failures >= 3 and stats.retries >= 1
            snap = s.metrics.snapshot()
            assert snap.retries["create"] == stats.retries
            assert snap.create_failures == stats.failures
            be.faults = Faults()  # the backend recovers
            async with pool.lease(timeout_seconds=10) as sb:
                assert (await sb.exec(["true"])).ok
            await pool.wait_ready(timeout_seconds=10)
    assert be.live == 0


async def test_create_rate_is_limited() -> None:
    be = FakeBackend(seed=10)
    async with Session(backend=be) as s, SandboxPool(s, size=10, max_size=10, create_rate=20, create_burst=2) as pool:
        start = time.monotonic()
        await pool.wait_ready(timeout_seconds=10)
        assert time.monotonic() - start >= 0.35  # 2 at once, then 8 at 20/s = 0.4 s
        assert be.created == 10


# -- reuse -------------------------------------------------------------------------


async def test_reuse_with_reset_hook() -> None:
    be = FakeBackend(seed=12)
    resets: list[str] = []

    async def reset(sb: object) -> None:
        assert hasattr(sb, "sandbox_id")
        resets.append(sb.sandbox_id)
        await sb.exec(["true"])  # type: ignore[attr-defined]

    async with Session(backend=be) as s, SandboxPool(s, size=1, max_size=1, reuse=True, reset=reset) as pool:
        ids = []
        for _ in range(3):
            async with pool.lease(timeout_seconds=5) as sb:
                ids.append(sb.sandbox_id)
        assert len(set(ids)) == 1
        assert resets[:2] == ids[:2]
        with pytest.raises(RuntimeError):
            async with pool.lease(timeout_seconds=5) as sb:
                raise RuntimeError("a lease that fails is not reused")
        async with pool.lease(timeout_seconds=5) as sb:
            assert sb.sandbox_id != ids[0]
        assert be.created == 2
    assert be.live == 0


async def test_failing_reset_discards_the_sandbox() -> None:
    be = FakeBackend(seed=13)

    async def reset(sb: object) -> None:
        raise RuntimeError("cannot clean")

    async with Session(backend=be) as s, SandboxPool(s, size=1, max_size=2, reuse=True, reset=reset) as pool:
        async with pool.lease(timeout_seconds=5) as sb1:
            pass
        async with pool.lease(timeout_seconds=5) as sb2:
            assert sb2.sandbox_id != sb1.sandbox_id
        await wait_until(lambda: pool.statistics().discarded == 2)
    assert be.live == 0


# -- sizing ------------------------------------------------------------------------


async def test_resize_grows_and_shrinks() -> None:
    be = FakeBackend(seed=14)
    async with Session(backend=be) as s, SandboxPool(s, size=2, max_size=8) as pool:
        await pool.wait_ready(timeout_seconds=5)
        await pool.resize(6)
        await pool.wait_ready(timeout_seconds=5)
        assert pool.statistics().idle == 6
        await pool.resize(1)
        assert pool.statistics().idle == 1
        assert be.live == 1  # resize returned after the surplus was destroyed
        with pytest.raises(SandboxValidationError):
            await pool.resize(9)
        await pool.resize(4, max_size=4)
        await pool.wait_ready(timeout_seconds=5)
        assert (pool.size, pool.max_size, pool.statistics().idle) == (4, 4, 4)
    assert be.live == 0


# -- closing -----------------------------------------------------------------------


async def test_close_lets_leases_finish_within_grace() -> None:
    be = FakeBackend(seed=15)
    done = []
    async with Session(backend=be) as s, SandboxPool(s, size=1, close_grace_seconds=5) as pool:
        entered = anyio.Event()

        async def rollout() -> None:
            async with pool.lease() as sb:
                entered.set()
                await anyio.sleep(0.1)
                done.append((await sb.exec(["echo", "done"])).stdout)

        async with anyio.create_task_group() as tg:
            tg.start_soon(rollout)
            await entered.wait()
            await pool.aclose()
            assert done == ["done\n"]
    assert be.live == 0


async def test_close_cancels_leases_after_grace_and_fails_waiters(backend_name: str) -> None:
    errors: list[BaseException] = []
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
                await wait_until(lambda: pool.statistics().waiting == 1, 30)
                start = time.monotonic()
                await pool.aclose()
                assert time.monotonic() - start < 10
        messages = sorted(str(e) for e in errors)
        assert messages == ["cannot lease from a closed pool", "the pool closed while this lease was held"]
        assert await own_live(s) == 0 and s.sandboxes == []
        assert tasks_now() == tasks0
    await wait_until(lambda: descendant_pids() <= procs0, 10)  # no sandbox process left behind


async def test_leaving_the_session_closes_its_pools() -> None:
    be = FakeBackend(seed=17)
    async with Session(backend=be) as s, SandboxPool(s, size=2) as pool:
        await pool.wait_ready(timeout_seconds=5)
        assert be.live == 2
        await s.aclose()  # the session closes the pool open under it (scopes stay nested)
        assert pool.state is PoolState.CLOSED
        assert be.live == 0


# -- statistics and metrics ----------------------------------------------------------


class RecordingMetrics(MetricsAggregator):
    def __init__(self) -> None:
        super().__init__()
        self.leases: list[tuple[float, bool]] = []
        self.gauges: list[tuple[int, int, int]] = []

    def lease(self, wait_seconds: float, *, warm: bool) -> None:
        super().lease(wait_seconds, warm=warm)
        self.leases.append((wait_seconds, warm))

    def pool_gauges(self, *, idle: int, leased: int, warming: int, pool_id: str = "") -> None:
        super().pool_gauges(idle=idle, leased=leased, warming=warming, pool_id=pool_id)
        self.gauges.append((idle, leased, warming))


async def test_events_reach_session_metrics_and_statistics_are_frozen() -> None:
    be = FakeBackend(seed=18, create_latency=Latency.constant(0.01))
    rec = RecordingMetrics()
    async with Session(backend=be) as s:
        s.metrics = rec
        async with SandboxPool(s, size=1, max_size=2) as pool:
            await pool.wait_ready(timeout_seconds=5)
            async with pool.lease():
                assert rec.gauges[-1][1] == 1  # one leased
                assert rec.snapshot().pool_leased == 1
            async with pool.lease():  # may be warm or cold, depending on the replacement
                pass
            stats = pool.statistics()
            assert isinstance(stats, PoolStatistics)
            with pytest.raises(dataclasses.FrozenInstanceError):
                stats.idle = 5  # type: ignore[misc]
    assert rec.leases[0][1] is True and rec.leases[0][0] < 1
    snap = rec.snapshot()
    assert len(rec.leases) == 2 and snap.leases == 2
    assert snap.pools == 0  # the closed pool's gauges were dropped
    assert (1, 0, 0) in rec.gauges
    assert rec.gauges[-1] == (0, 0, 0)
    assert stats.warm_hits + stats.cold_waits == 2
