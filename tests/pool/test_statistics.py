"""Statistics and metrics: the snapshot is frozen, events reach the session's metrics, the warm-hit rate."""

from __future__ import annotations

import dataclasses

import anyio
import pytest

from cwsandbox_async import PoolStatistics, SandboxPool, Session
from cwsandbox_async.testing import FakeBackend, Latency


class Recorder:
    """Wraps a session's metrics and records the pool's lease events and gauges."""

    def __init__(self, session: Session) -> None:
        self.leases: list[tuple[float, bool]] = []
        self.gauges: list[tuple[int, int, int]] = []
        metrics = session.metrics
        recorder = self

        class Recording(type(metrics)):  # type: ignore[misc]
            def lease(self, wait_seconds: float, *, warm: bool) -> None:
                super().lease(wait_seconds, warm=warm)
                recorder.leases.append((wait_seconds, warm))

            def pool_gauges(self, *, idle: int, leased: int, warming: int, pool_id: str = "") -> None:
                super().pool_gauges(idle=idle, leased=leased, warming=warming, pool_id=pool_id)
                recorder.gauges.append((idle, leased, warming))

        metrics.__class__ = Recording


async def test_events_reach_session_metrics_and_statistics_are_frozen() -> None:
    be = FakeBackend(seed=18, create_latency=Latency.constant(0.01))
    async with Session(backend=be) as s:
        rec = Recorder(s)
        async with SandboxPool(s, size=1, max_size=2) as pool:
            await pool.wait_ready(timeout_seconds=5)
            async with pool.lease():
                assert rec.gauges[-1][1] == 1  # one leased
                assert s.metrics.snapshot().pool_leased == 1
            async with pool.lease():  # may be warm or cold, depending on the replacement
                pass
            stats = pool.statistics()
            assert isinstance(stats, PoolStatistics)
            with pytest.raises(dataclasses.FrozenInstanceError):
                stats.idle = 5  # type: ignore[misc]
        snap = s.metrics.snapshot()
    assert rec.leases[0][1] is True and rec.leases[0][0] < 1
    assert len(rec.leases) == 2 and snap.leases == 2
    assert snap.pools == 0  # the closed pool's gauges were dropped
    assert (1, 0, 0) in rec.gauges
    assert rec.gauges[-1] == (0, 0, 0)
    assert stats.warm_hits + stats.cold_waits == 2


async def test_warm_hit_rate() -> None:
    be = FakeBackend(seed=19, create_latency=Latency.constant(1))
    async with Session(backend=be) as s, SandboxPool(s, size=2, max_size=2) as pool:
        assert pool.statistics().warm_hit_rate is None  # no lease yet
        await pool.wait_ready()
        async with anyio.create_task_group() as tg:
            for _ in range(4):  # two are served warm, two wait for the replacements
                tg.start_soon(_lease_once, pool)
        stats = pool.statistics()
    assert (stats.warm_hits, stats.cold_waits) == (2, 2)
    assert stats.warm_hit_rate == 0.5


async def _lease_once(pool: SandboxPool) -> None:
    async with pool.lease() as sb:
        await sb.exec(["true"])


async def test_a_fresh_per_lease_pool_keeps_up_with_demand_when_creation_can() -> None:
    """Rollouts that hold a sandbox longer than a create takes always find one warm (refills keep up)."""
    be = FakeBackend(seed=20, create_latency=Latency.constant(0.05))
    async with Session(backend=be) as s, SandboxPool(s, size=8) as pool:
        await pool.wait_ready()

        async def rollout() -> None:
            async with pool.lease() as sb:
                await sb.exec(["true"])
                await anyio.sleep(0.2)

        limiter = anyio.CapacityLimiter(8)

        async def bounded() -> None:
            async with limiter:
                await rollout()

        async with anyio.create_task_group() as tg:
            for _ in range(200):
                tg.start_soon(bounded)
        stats = pool.statistics()
    assert stats.warm_hit_rate == 1.0, stats
