"""A lease with a hold timeout sets its sandbox's backend-side lifetime, so a killed driver cannot leak it."""

from __future__ import annotations

import anyio
import pytest

from cwsandbox_async import PoolTimeoutError, SandboxNotRunningError, SandboxPool, SandboxValidationError, Session
from cwsandbox_async.testing import FakeBackend, Latency

from .conftest import wait_until


class LifetimeBackend(FakeBackend):
    """Records ``set_lifetime`` calls; can refuse (``refuse``) or hang (``hang``) for chosen sandboxes."""

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.lifetimes: list[tuple[str, float | None, float]] = []
        self.refuse: set[str] = set()
        self.hang: set[str] = set()

    async def set_lifetime(self, sandbox_id: str, seconds: float | None) -> None:
        self.lifetimes.append((sandbox_id, seconds, anyio.current_time()))
        if sandbox_id in self.hang:
            await anyio.sleep_forever()
        if sandbox_id in self.refuse:
            raise SandboxValidationError(f"cannot extend the lifetime of {sandbox_id}", sandbox_id=sandbox_id)


async def test_a_lease_with_a_hold_timeout_sets_the_lifetime_before_the_block_runs() -> None:
    be = LifetimeBackend(seed=40)
    async with Session(backend=be) as s, SandboxPool(s, size=2, lifetime_margin_seconds=15) as pool:
        async with pool.lease(hold_timeout_seconds=30) as sb:
            assert be.lifetimes == [(sb.sandbox_id, 45, anyio.current_time())]
        async with pool.lease():  # no hold timeout: the sandbox keeps the lifetime it was created with
            pass
        assert len(be.lifetimes) == 1
    async with (
        Session(backend=be) as s,
        SandboxPool(s, size=1, hold_timeout_seconds=10) as pool,
        pool.lease() as sb,  # the pool's default hold timeout counts too
    ):
        assert be.lifetimes[-1][:2] == (sb.sandbox_id, 10 + pool.options.lifetime_margin_seconds)


@pytest.mark.parametrize("how", ["refuse", "hang"])
async def test_a_sandbox_whose_lifetime_cannot_be_set_is_not_handed_out(how: str) -> None:
    be = LifetimeBackend(seed=41)
    async with Session(backend=be) as s, SandboxPool(s, size=2, max_size=3) as pool:
        await pool.wait_ready()
        first = next(iter(be.world))
        getattr(be, how).add(first)
        async with pool.lease(hold_timeout_seconds=30, timeout_seconds=60) as sb:
            assert sb.sandbox_id != first
        assert pool.statistics().discarded == 1
        await wait_until(lambda: first not in be.world)  # destroyed, not leaked
    assert be.live == 0


async def test_a_lease_whose_sandboxes_all_refuse_a_lifetime_times_out() -> None:
    class Refusing(LifetimeBackend):
        async def set_lifetime(self, sandbox_id: str, seconds: float | None) -> None:
            raise SandboxNotRunningError("gone", sandbox_id=sandbox_id)

    be = Refusing(seed=42, create_latency=Latency.constant(0.01))
    async with Session(backend=be) as s, SandboxPool(s, size=1, max_size=2) as pool:
        with pytest.raises(PoolTimeoutError):
            async with pool.lease(hold_timeout_seconds=30, timeout_seconds=1):
                pass
        assert pool.statistics().discarded > 0
    assert be.live == 0
