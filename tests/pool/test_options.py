"""Settings are validated up front; caller mistakes raise typed errors that are not infrastructure."""

from __future__ import annotations

import pytest

from cwsandbox_async import PoolClosedError, PoolError, PoolState, SandboxPool, SandboxValidationError, Session
from cwsandbox_async.pool import PoolOptions
from cwsandbox_async.testing import FakeBackend


@pytest.mark.parametrize(
    "kwargs",
    [
        {"size": -1},
        {"size": 2, "max_size": 0},
        {"size": 5, "max_size": 4},
        {"size": 1.5},
        {"reset": lambda sb: None},  # reset without reuse
        {"reuse": True, "reset": "not callable"},
        {"create_rate": 0},
        {"create_rate": float("inf")},
        {"create_burst": 3},  # burst without rate
        {"create_rate": 5, "create_burst": 0},
        {"create_concurrency": 0},
        {"create_latency_tolerance": 1.0},
        {"create_attempts": 0},
        {"lease_timeout_seconds": 0},
        {"hold_timeout_seconds": -1},
        {"lifetime_margin_seconds": float("nan")},
        {"close_grace_seconds": -1},
        {"close_timeout_seconds": 0},
        {"health_check_interval_seconds": -1},
        {"bogus_option": 1},
    ],
)
async def test_bad_arguments_raise_validation_error(kwargs: dict[str, object]) -> None:
    async with Session(backend=FakeBackend()) as s:
        with pytest.raises(SandboxValidationError):
            SandboxPool(s, **kwargs)  # type: ignore[arg-type]


def test_options_document_their_defaults() -> None:
    opts = PoolOptions()
    assert (opts.size, opts.max_size, opts.reuse, opts.create_rate, opts.create_concurrency) == (
        8,
        16,
        False,
        None,
        None,
    )
    assert opts.close_timeout_seconds is None  # the session's timeouts.close_seconds
    for name in PoolOptions.__dataclass_fields__:
        assert f"``{name}``" in (PoolOptions.__doc__ or ""), f"PoolOptions does not document {name}"


async def test_lifecycle_is_guarded_and_caller_mistakes_are_not_infrastructure() -> None:
    async with Session(backend=FakeBackend()) as s:
        pool = SandboxPool(s, size=1)
        assert pool.state is PoolState.NEW
        with pytest.raises(PoolError, match="not open") as unentered:
            async with pool.lease():
                pass
        assert not unentered.value.infrastructure
        async with pool:
            assert pool.state is PoolState.OPEN
            with pytest.raises(PoolError) as twice:
                await pool.__aenter__()
            assert not twice.value.infrastructure
            with pytest.raises(SandboxValidationError):
                pool.lease(timeout_seconds=-1)
            lease = pool.lease()
            async with lease:
                pass
            with pytest.raises(PoolError, match="entered once") as reentered:
                async with lease:
                    pass
            assert not reentered.value.infrastructure
        assert pool.state is PoolState.CLOSED
        with pytest.raises(PoolClosedError, match="cannot lease from a closed pool") as closed:
            async with pool.lease():
                pass
        assert not closed.value.infrastructure
        with pytest.raises(PoolClosedError) as reopened:
            async with pool:
                pass
        assert not reopened.value.infrastructure
        await pool.aclose()  # idempotent


async def test_pool_needs_an_open_session() -> None:
    s = Session(backend=FakeBackend())
    with pytest.raises(PoolError, match="session is not open") as info:
        async with SandboxPool(s, size=1):
            pass
    assert not info.value.infrastructure
