"""A create that fails for the caller's mistake is not retried: the pool says so at once, in its words.

A validation error (a Kubernetes session without an image, say) or refused credentials fail the same
way on every attempt; retrying them with back-off only delays the error and buries it under "N attempts
failed in a row". The platform's failures are still retried (``test_creation``).
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from cwsandbox_async import (
    SandboxBackendUnavailableError,
    SandboxError,
    SandboxPool,
    SandboxValidationError,
    Session,
)
from cwsandbox_async.testing import FakeBackend

from .conftest import wait_until

#: Room for five tries with back-off, which none of these may use.
RETRYING = {"create_attempts": 5, "max_consecutive_failures": 5, "create_backoff_seconds": 0.5}


class Refusing(FakeBackend):
    """A fake whose create raises ``error`` (until ``error`` is None), counting creates and destroys."""

    def __init__(self, error: SandboxError | None, **kw: Any) -> None:
        super().__init__(seed=41, **kw)
        self.error = error
        self.creates = 0
        self.destroys: list[str] = []

    async def create(self, spec: Any) -> None:
        self.creates += 1
        if self.error is not None:
            raise self.error
        await super().create(spec)

    async def destroy(self, sandbox_id: str) -> None:
        self.destroys.append(sandbox_id)
        await super().destroy(sandbox_id)


def needs_an_image() -> SandboxValidationError:
    return SandboxValidationError("the kubernetes backend needs an image: set SandboxDefaults.image or image=...")


@pytest.mark.parametrize(
    "error",
    [needs_an_image(), SandboxBackendUnavailableError("credentials rejected (401)", infrastructure=False)],
    ids=["validation", "credentials"],
)
async def test_a_callers_mistake_at_create_is_tried_once_and_raised_as_itself(error: SandboxError) -> None:
    be = Refusing(error)
    async with Session(backend=be) as s, SandboxPool(s, size=1, **RETRYING) as pool:  # type: ignore[arg-type]
        start = anyio.current_time()
        with pytest.raises(type(error)) as leased:
            async with pool.lease(timeout_seconds=60):
                pytest.fail("nothing could be leased")
        assert be.creates == 1  # one attempt: no retry
        assert anyio.current_time() - start < RETRYING["create_backoff_seconds"]  # virtual time: no back-off slept
        assert str(leased.value) == str(error) and "in a row" not in str(leased.value)
        assert leased.value.infrastructure is False
        assert pool.statistics().retries == 0 and pool.statistics().failures == 1
        with pytest.raises(type(error), match=str(error)[:20]):
            await pool.wait_ready()  # the same answer from wait_ready, at once
        assert be.creates == 1


async def test_a_validation_error_at_create_destroys_nothing() -> None:
    """Nothing was made, so nothing is destroyed (a destroy against an unreachable API would warn)."""
    be = Refusing(needs_an_image())
    async with Session(backend=be) as s:
        with pytest.raises(SandboxValidationError):
            await s.create_sandbox()
    assert be.creates == 1 and be.destroys == []


async def test_the_pool_serves_again_once_the_mistake_is_fixed() -> None:
    be = Refusing(needs_an_image())
    async with Session(backend=be) as s, SandboxPool(s, size=1, **RETRYING) as pool:  # type: ignore[arg-type]
        with pytest.raises(SandboxValidationError):
            await pool.wait_ready()
        be.error = None  # the caller fixed it: the pool's next creation (after its cool-down) succeeds
        await wait_until(lambda: pool.statistics().created == 1)
        await pool.wait_ready(timeout_seconds=60)
        async with pool.lease(timeout_seconds=60) as sb:
            assert (await sb.exec(["echo", "ok"])).stdout == "ok\n"
            await pool.wait_ready(timeout_seconds=60)  # waits for the refill: the old mistake is history
        assert pool.statistics().retries == 0
