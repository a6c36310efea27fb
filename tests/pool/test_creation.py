"""Creating sandboxes: failures surface and recover, the rate limit, and pacing by measured capacity."""

from __future__ import annotations

import anyio
import pytest

from cwsandbox_async import SandboxCreationError, SandboxPool, Session
from cwsandbox_async._types import SandboxSpec
from cwsandbox_async.testing import FakeBackend, Faults, Latency

from .conftest import FAST


async def test_persistent_create_failure_surfaces_then_recovers() -> None:
    be = FakeBackend(seed=9, faults=Faults(create_failure=1.0))
    async with Session(backend=be) as s:
        pool = SandboxPool(s, size=2, create_attempts=2, max_consecutive_failures=3, **FAST)  # type: ignore[arg-type]
        async with pool:
            start = anyio.current_time()
            with pytest.raises(SandboxCreationError, match="attempts failed in a row") as info:
                async with pool.lease(timeout_seconds=30):
                    pass
            assert anyio.current_time() - start < 1  # failed fast, not at the lease deadline
            assert info.value.infrastructure
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


class TestInRealTime:
    """aiolimiter schedules its next wake-up by float arithmetic on the loop clock; on looptime's
    quantised virtual clock that can land on the same instant forever, so these run in real time."""

    @pytest.fixture
    def anyio_backend(self) -> str:
        return "asyncio"

    async def test_create_rate_is_limited(self) -> None:
        be = FakeBackend(seed=10)
        async with (
            Session(backend=be) as s,
            SandboxPool(s, size=10, max_size=10, create_rate=20, create_burst=2) as pool,
        ):
            start = anyio.current_time()
            await pool.wait_ready(timeout_seconds=10)
            assert anyio.current_time() - start >= 0.35  # 2 at once, then 8 at 20/s = 0.4 s
            assert be.created == 10


class CoresBackend(FakeBackend):
    """Creation costs ``work`` seconds of one of ``cores`` workers: past ``cores`` at once, creates queue.

    A model of the local backend (creation is CPU work on this machine): throughput tops
    out at ``cores / work`` per second, and every create beyond that only adds latency.
    """

    def __init__(self, cores: int, work: float, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self._cores = anyio.Semaphore(cores)
        self.work = work
        self.in_flight = self.peak_in_flight = 0

    async def create(self, spec: SandboxSpec) -> None:
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            async with self._cores:
                await anyio.sleep(self.work)
            await super().create(spec)
        finally:
            self.in_flight -= 1


async def test_adaptive_pacing_keeps_creates_near_capacity_and_keeps_up() -> None:
    cores, work, n = 4, 0.05, 96
    be = CoresBackend(cores, work, seed=20)
    async with Session(backend=be) as s, SandboxPool(s, size=n, max_size=n) as pool:
        start = anyio.current_time()
        await pool.wait_ready(timeout_seconds=60)
        elapsed = anyio.current_time() - start
        stats = pool.statistics()
    ideal = n * work / cores  # every core busy all the time
    assert elapsed < 1.2 * ideal, (elapsed, ideal)  # throughput close to capacity
    assert be.peak_in_flight <= 8 * cores, be.peak_in_flight  # unpaced, all 96 would queue at once
    assert cores <= stats.create_limit <= 6 * cores
    assert stats.create_latency_seconds is not None
    assert stats.create_latency_seconds <= 4 * work


async def test_adaptive_pacing_grows_to_the_cap_when_latency_stays_flat() -> None:
    be = CoresBackend(cores=1000, work=1.0, seed=21)  # a cluster: creates take 1 s however many run
    async with Session(backend=be) as s, SandboxPool(s, size=200, max_size=200) as pool:
        start = anyio.current_time()
        await pool.wait_ready(timeout_seconds=600)
        elapsed = anyio.current_time() - start
        stats = pool.statistics()
    assert elapsed <= 9  # slow start doubles per round: 2, 4, ... 128, then the rest
    assert be.peak_in_flight >= 64
    assert stats.create_limit >= 64


async def test_failures_shrink_the_create_limit() -> None:
    be = CoresBackend(cores=1000, work=1.0, seed=22)
    async with Session(backend=be) as s, SandboxPool(s, size=64, max_size=64, **FAST) as pool:  # type: ignore[arg-type]
        await pool.wait_ready(timeout_seconds=600)
        grown = pool.statistics().create_limit
        be.faults = Faults(create_failure=1.0)
        await pool.resize(0)
        await pool.resize(64)
        await anyio.sleep(3)
        assert pool.statistics().create_limit <= grown / 4
        be.faults = Faults()
        async with pool.lease(timeout_seconds=600):  # waits for the first create that succeeds again
            pass
        await pool.wait_ready(timeout_seconds=600)


async def test_a_fixed_create_concurrency_is_kept() -> None:
    be = CoresBackend(cores=1000, work=1.0, seed=23)
    async with Session(backend=be) as s, SandboxPool(s, size=30, max_size=30, create_concurrency=3) as pool:
        start = anyio.current_time()
        await pool.wait_ready(timeout_seconds=600)
        assert anyio.current_time() - start == pytest.approx(10, abs=0.1)
        assert pool.statistics().create_limit == 3
    assert be.peak_in_flight == 3


async def test_noisy_create_latency_is_not_read_as_congestion() -> None:
    """Kubernetes-like starts (median 1 s, p99 5 s) that do not slow down with concurrency: the cap keeps growing."""
    be = FakeBackend(seed=1, create_latency=Latency.lognormal(median=1.0, p99=5.0))
    async with Session(backend=be) as s, SandboxPool(s, size=256, max_size=256) as pool:
        await pool.wait_ready(timeout_seconds=600)
        assert pool.statistics().create_limit >= 100
