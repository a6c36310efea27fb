"""A pool whose background work fails (a bug) moves to FAILED, and says so to every lease at once."""

from __future__ import annotations

import logging

import anyio
import pytest
from guards import HANG_GUARD_SECONDS

from cwsandbox_async import PoolError, PoolState, PoolTimeoutError, SandboxPool, Session
from cwsandbox_async._types import SandboxSpec
from cwsandbox_async.testing import FakeBackend, Faults

from .conftest import FAST, tasks_now


class BuggyHook(Exception):
    """Stands for any bug: an exception nobody expects out of background work."""


def break_retries(session: Session) -> None:
    """Make the session's ``metrics.retry`` raise (a bug in code the pool's background calls)."""
    metrics = session.metrics

    class Broken(type(metrics)):  # type: ignore[misc]
        def retry(self, what: str) -> None:
            raise BuggyHook(f"retry({what!r})")

    metrics.__class__ = Broken


async def test_a_bug_in_background_work_fails_the_pool_and_every_lease_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    be = FakeBackend(seed=30, faults=Faults(create_failure=1.0))  # the first create fails, its retry hits the bug
    async with Session(backend=be) as s:
        tasks0 = tasks_now()
        break_retries(s)
        with caplog.at_level(logging.ERROR, logger="cwsandbox_async"):
            async with SandboxPool(s, size=2, **FAST) as pool:  # type: ignore[arg-type]
                start = anyio.current_time()
                with pytest.raises(PoolError, match="the pool failed") as waiting:
                    async with pool.lease(timeout_seconds=30):
                        pytest.fail("nothing could be leased")
                assert anyio.current_time() - start < 1  # at once, not at the lease deadline
                assert not isinstance(waiting.value, PoolTimeoutError)
                assert isinstance(waiting.value.__cause__, BuggyHook)
                assert not waiting.value.infrastructure  # a bug is not the platform's fault
                stats = pool.statistics()
                assert stats.state is PoolState.FAILED and pool.state is PoolState.FAILED
                assert isinstance(stats.failure, BuggyHook)
                with pytest.raises(PoolError, match="the pool failed") as later:
                    async with pool.lease():
                        pass
                assert isinstance(later.value.__cause__, BuggyHook)
                with pytest.raises(PoolError, match="the pool failed"):
                    await pool.wait_ready()
                with pytest.raises(PoolError, match="the pool failed"):
                    await pool.resize(4)
            assert pool.state is PoolState.CLOSED
        assert [r for r in caplog.records if "background work failed" in r.getMessage()], "not logged at ERROR"
        assert tasks_now() == tasks0
    assert be.live == 0


async def test_leases_held_when_the_pool_fails_keep_their_sandbox_and_release_it() -> None:
    be = FakeBackend(seed=31)
    async with Session(backend=be) as s, SandboxPool(s, size=1, max_size=2, **FAST) as pool:  # type: ignore[arg-type]
        await pool.wait_ready()
        break_retries(s)
        be.faults = Faults(create_failure=1.0)  # the refill for the next lease fails, then hits the bug
        async with pool.lease() as sb:
            with anyio.fail_after(HANG_GUARD_SECONDS):
                while pool.state is not PoolState.FAILED:  # noqa: ASYNC110 - the pool's own state
                    await anyio.sleep(0.01)
            assert (await sb.exec(["echo", "still here"])).stdout == "still here\n"
        assert sb.sandbox_id not in be.world  # released: destroyed in the lease's own task
        assert pool.statistics().leased == 0
    assert be.live == 0


class BuggyCreateBackend(FakeBackend):
    """A backend whose create lets an unexpected exception escape (a bug: not in its known-errors map)."""

    async def create(self, spec: SandboxSpec) -> None:
        await super().create(spec)
        raise KeyError("a backend bug")


async def test_an_unexpected_error_from_the_backend_fails_the_pool_not_relabelled_as_infrastructure() -> None:
    be = BuggyCreateBackend(seed=32)
    async with Session(backend=be) as s, SandboxPool(s, size=2, **FAST) as pool:  # type: ignore[arg-type]
        with pytest.raises(PoolError, match="the pool failed") as info:
            async with pool.lease(timeout_seconds=30):
                pass
        assert isinstance(info.value.__cause__, KeyError)
        assert not info.value.infrastructure
        stats = pool.statistics()
        assert stats.state is PoolState.FAILED and isinstance(stats.failure, KeyError)
        assert stats.failures == 0  # a bug is not counted as a failed create attempt
    assert be.live == 0  # the half-created sandboxes were destroyed
