"""The hard cap: never more than ``max_size`` sandboxes alive, whatever the interleaving."""

from __future__ import annotations

import math
import random

import anyio

from cwsandbox_async import PoolTimeoutError, SandboxCreationError, SandboxPool, Session
from cwsandbox_async.testing import FakeBackend, Faults, Latency

from .conftest import FAST, make_backend, own_live, settle, tasks_now


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
