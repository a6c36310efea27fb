"""Reuse with a reset hook, and resizing."""

from __future__ import annotations

import anyio
import pytest
from guards import HANG_GUARD_SECONDS

from cwsandbox_async import Sandbox, SandboxPool, SandboxValidationError, Session
from cwsandbox_async.testing import FakeBackend

from .conftest import wait_until


async def test_reuse_with_reset_hook() -> None:
    be = FakeBackend(seed=12)
    resets: list[str] = []

    async def reset(sb: Sandbox) -> None:
        resets.append(sb.sandbox_id)
        await sb.exec(["true"])

    async with Session(backend=be) as s, SandboxPool(s, size=1, max_size=1, reuse=True, reset=reset) as pool:
        ids = []
        for _ in range(3):
            async with pool.lease(timeout_seconds=HANG_GUARD_SECONDS) as sb:
                ids.append(sb.sandbox_id)
        assert len(set(ids)) == 1
        assert resets[:2] == ids[:2]
        with pytest.raises(RuntimeError):
            async with pool.lease(timeout_seconds=HANG_GUARD_SECONDS) as sb:
                raise RuntimeError("a lease that fails is not reused")
        async with pool.lease(timeout_seconds=HANG_GUARD_SECONDS) as sb:
            assert sb.sandbox_id != ids[0]
        assert be.created == 2
    assert be.live == 0


async def test_failing_reset_discards_the_sandbox() -> None:
    be = FakeBackend(seed=13)

    async def reset(sb: Sandbox) -> None:
        raise RuntimeError("cannot clean")

    async with Session(backend=be) as s, SandboxPool(s, size=1, max_size=2, reuse=True, reset=reset) as pool:
        async with pool.lease(timeout_seconds=HANG_GUARD_SECONDS) as sb1:
            pass
        async with pool.lease(timeout_seconds=HANG_GUARD_SECONDS) as sb2:
            assert sb2.sandbox_id != sb1.sandbox_id
        await wait_until(lambda: pool.statistics().discarded == 2)
    assert be.live == 0


async def test_a_slow_reset_is_bounded_and_discards_the_sandbox() -> None:
    be = FakeBackend(seed=13)

    async def reset(sb: Sandbox) -> None:
        await anyio.sleep(3600)

    async with (
        Session(backend=be) as s,
        SandboxPool(s, size=1, max_size=1, reuse=True, reset=reset, reset_timeout_seconds=5) as pool,
    ):
        async with pool.lease() as sb1:
            pass
        start = anyio.current_time()
        async with pool.lease(timeout_seconds=HANG_GUARD_SECONDS) as sb2:
            assert sb2 is not sb1
        assert anyio.current_time() - start == pytest.approx(5, abs=0.1)
        assert pool.statistics().discarded == 1
    assert be.live == 0


async def test_resize_grows_and_shrinks() -> None:
    be = FakeBackend(seed=14)
    async with Session(backend=be) as s, SandboxPool(s, size=2, max_size=8) as pool:
        await pool.wait_ready(timeout_seconds=HANG_GUARD_SECONDS)
        await pool.resize(6)
        await pool.wait_ready(timeout_seconds=HANG_GUARD_SECONDS)
        assert pool.statistics().idle == 6
        await pool.resize(1)
        assert pool.statistics().idle == 1
        assert be.live == 1  # resize returned after the surplus was destroyed
        with pytest.raises(SandboxValidationError):
            await pool.resize(9)
        await pool.resize(4, max_size=4)
        await pool.wait_ready(timeout_seconds=HANG_GUARD_SECONDS)
        assert (pool.size, pool.max_size, pool.statistics().idle) == (4, 4, 4)
    assert be.live == 0
