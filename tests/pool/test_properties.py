"""Property test: random lease / cancel / resize / kill / fail sequences never break the pool's invariants.

While a sequence runs, a monitor checks every millisecond that the backend never holds
more than ``max_size`` sandboxes for the pool, that the pool's own count agrees, and
that the idle set stays within its target. Each lease checks that nobody else holds
its sandbox and that it is alive unless the test killed it. After the pool closes,
nothing is alive, every gauge is zero, every sandbox created was destroyed, and no
task is left. Deterministic (``derandomize``) and small enough to run in seconds.
"""

from __future__ import annotations

import asyncio
import math

import anyio
from guards import HANG_GUARD_SECONDS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cwsandbox_async import (
    PoolClosedError,
    PoolTimeoutError,
    SandboxCreationError,
    SandboxNotRunningError,
    SandboxPool,
    Session,
)
from cwsandbox_async._types import SandboxStatus
from cwsandbox_async.testing import FakeBackend, Faults, Latency


class SlowStatusBackend(FakeBackend):
    """A status call takes time, as it does on real backends, so cancellation can land inside it."""

    async def status(self, sandbox_id: str) -> SandboxStatus:
        await anyio.sleep(self.rng.uniform(0.0, 0.002))
        return await super().status(sandbox_id)


lease_op = st.tuples(
    st.just("lease"),
    st.integers(0, 15),  # ms the body holds the sandbox
    st.one_of(st.none(), st.integers(0, 20)),  # ms after which the caller cancels it
    st.sampled_from([0.03, 1.0]),  # lease timeout (s)
)
ops_strategy = st.lists(
    st.one_of(
        lease_op,
        lease_op,
        st.tuples(st.just("resize"), st.integers(0, 4)),
        st.tuples(st.just("sleep"), st.integers(0, 10)),
        st.tuples(st.just("kill"), st.integers(0, 7)),
        st.tuples(st.just("faults"), st.sampled_from([0.0, 0.0, 0.3, 1.0])),
    ),
    max_size=25,
)


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    report_multiple_bugs=False,  # one falsifying example, shrunk, within the per-test timeout
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    max_size=st.integers(1, 4),
    size=st.integers(0, 4),
    reuse=st.booleans(),
    seed=st.integers(0, 1000),
    ops=ops_strategy,
)
async def test_pool_invariants_hold_for_random_sequences(
    max_size: int, size: int, reuse: bool, seed: int, ops: list[tuple[object, ...]]
) -> None:
    size = min(size, max_size)
    be = SlowStatusBackend(
        seed=seed,
        create_latency=Latency.uniform(0.0, 0.004),
        destroy_latency=Latency.uniform(0.0, 0.002),
    )
    held: set[str] = set()
    killed: set[str] = set()
    async with Session(backend=be) as s:
        tasks0 = len(asyncio.all_tasks())
        pool = SandboxPool(
            s,
            size,
            max_size,
            reuse=reuse,
            create_attempts=2,
            create_backoff_seconds=0.002,
            create_backoff_max_seconds=0.01,
            max_consecutive_failures=3,
            health_check_interval_seconds=0.01,
            close_grace_seconds=0.05,
            create_timeout_seconds=1.0,
        )

        def check() -> None:
            stats = pool.statistics()
            assert be.live <= max_size, (be.live, stats)
            assert stats.alive <= max_size, stats
            assert stats.idle <= stats.size, stats
            assert min(stats.idle, stats.leased, stats.warming, stats.waiting, stats.destroying) >= 0, stats

        async def monitor() -> None:
            while True:
                check()
                await anyio.sleep(0.001)

        async def rollout(hold_ms: int, cancel_ms: int | None, lease_timeout: float) -> None:
            with anyio.move_on_after(math.inf if cancel_ms is None else cancel_ms / 1000):
                try:
                    async with pool.lease(timeout_seconds=lease_timeout) as sb:
                        assert sb.sandbox_id not in held, "one sandbox leased twice at once"
                        held.add(sb.sandbox_id)
                        try:
                            assert (await sb.exec(["true"])).ok
                            await anyio.sleep(hold_ms / 1000)
                        except SandboxNotRunningError:
                            assert sb.sandbox_id in killed, "a dead sandbox was handed out"
                        finally:
                            held.discard(sb.sandbox_id)
                except (PoolTimeoutError, SandboxCreationError, PoolClosedError):
                    pass

        with anyio.fail_after(HANG_GUARD_SECONDS):  # a hang is a failure, not a stuck test run
            async with pool, anyio.create_task_group() as outer:
                outer.start_soon(monitor)
                async with anyio.create_task_group() as work:
                    for op in ops:
                        kind = op[0]
                        if kind == "lease":
                            work.start_soon(rollout, *op[1:])
                        elif kind == "resize":
                            await pool.resize(min(int(op[1]), max_size))  # type: ignore[call-overload]
                        elif kind == "sleep":
                            await anyio.sleep(int(op[1]) / 1000)  # type: ignore[call-overload]
                        elif kind == "kill":
                            alive = sorted(sid for sid, x in be.world.items() if x.alive and x.ready)
                            if alive:
                                victim = alive[int(op[1]) % len(alive)]  # type: ignore[call-overload]
                                be.world[victim].alive = False
                                killed.add(victim)
                        else:
                            be.faults = Faults(create_failure=float(op[1]))  # type: ignore[arg-type]
                        check()
                stats = pool.statistics()
                assert (stats.leased, stats.waiting) == (0, 0), f"nothing holds these: {stats}"
                outer.cancel_scope.cancel()
        stats = pool.statistics()
        assert be.live == 0
        assert be.max_live <= max_size
        assert stats.max_alive <= max_size
        assert (stats.idle, stats.leased, stats.warming, stats.waiting, stats.destroying) == (0, 0, 0, 0, 0)
        assert stats.created == stats.destroyed
        assert s.sandboxes == []
        assert len(asyncio.all_tasks()) == tasks0
