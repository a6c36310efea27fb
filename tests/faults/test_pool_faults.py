"""Seeded faults through a SandboxPool and the gatherer: bounded, typed, recovering, leak-free.

Each seed runs one training-loop-shaped scenario on a FakeBackend that fails in
every way it can at once (creates that fail, hang or start too slowly; execs that
hang, lose their transport, lose their sandbox or end without a status; sandboxes
that die while idle; destroys that are lost, fail or hang):

1. rollouts under those faults: every rollout ends within its bound, every
   outcome is either its own item's output or a typed infrastructure failure;
2. the platform stops creating altogether: leases fail fast and typed
   (``SandboxCreationError``), well before their lease deadline;
3. the platform heals: the pool is back at its warm target within a bound and
   every rollout succeeds;
4. shutdown: within a bound; the only sandboxes left alive are exactly those
   whose destroy a fault dropped, and a sweep from a fresh session finds and
   removes exactly those. No task is left behind.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import pytest
from guards import HANG_GUARD_SECONDS

from cwsandbox_async import (
    OutcomeKind,
    SandboxCreationError,
    SandboxDefaults,
    SandboxPool,
    Session,
    gather,
)
from cwsandbox_async.testing import FakeBackend, Faults, Latency

from .conftest import TIMEOUTS, alive_ids, check_outcomes, tasks_now, virtual_time

anyio_backend = pytest.fixture(virtual_time)

SEEDS = range(20)
#: Everything that can go wrong, at once (probabilities per operation).
ALL_FAULTS = Faults(
    create_failure=0.15,
    create_hang=0.04,
    exec_transport_error=0.05,
    exec_hang=0.03,
    death_mid_exec=0.05,
    truncated_stream=0.05,
    lost_delete=0.05,
    idle_death=0.05,
    destroy_hang=0.02,
    destroy_failure=0.03,
)
CREATE_TIMEOUT = 0.3
EXEC_TIMEOUT = 0.2
LEASE_TIMEOUT = 2.0
#: A rollout (lease wait + exec + its deadline's grace + release) must end within this.
ROLLOUT_BOUND = 5.0


def rollout(pool: SandboxPool, i: int) -> Callable[[], Awaitable[str]]:
    async def run() -> str:
        with anyio.move_on_after(ROLLOUT_BOUND) as bound:
            async with pool.lease() as sb:
                return (await sb.exec(["echo", str(i)], timeout_seconds=EXEC_TIMEOUT)).stdout
        assert not bound.cancelled_caught
        raise AssertionError(f"rollout {i} outlived its {ROLLOUT_BOUND} s bound")

    return run


def backend(seed: int) -> FakeBackend:
    return FakeBackend(
        seed=seed,
        # median 3 ms, but 1 in 100 starts takes over 0.4 s: slower than the create deadline
        create_latency=Latency.lognormal(0.003, 0.4),
        exec_latency=Latency.uniform(0.0, 0.003),
        destroy_latency=Latency.uniform(0.0, 0.003),
        faults=ALL_FAULTS,
    )


@pytest.mark.parametrize("seed", SEEDS)
async def test_pool_under_seeded_faults_is_bounded_typed_recovers_and_leaks_nothing(seed: int) -> None:
    be = backend(seed)
    tags = ("faults", f"pool-seed-{seed}")
    defaults = SandboxDefaults(
        tags=tags, create_timeout_seconds=CREATE_TIMEOUT, operation_timeout_seconds=0.3, exec_timeout_seconds=0.2
    )
    tasks0 = tasks_now()
    size = 4
    with anyio.fail_after(HANG_GUARD_SECONDS):
        async with Session(defaults, backend=be, handle_signals=False, timeouts=TIMEOUTS) as s:
            pool = SandboxPool(
                s,
                size=size,
                max_size=8,
                create_attempts=3,
                create_backoff_seconds=0.01,
                create_backoff_max_seconds=0.05,
                max_consecutive_failures=6,
                lease_timeout_seconds=LEASE_TIMEOUT,
                health_check_interval_seconds=0.05,
                close_grace_seconds=0.5,
            )
            async with pool:
                # 1. everything fails some of the time
                keys = list(range(60))
                outcomes = await gather({i: rollout(pool, i) for i in keys}, limit=16)
                counts = check_outcomes(outcomes, keys)
                assert counts.get("ok", 0) > 0, counts
                assert pool.statistics().max_alive <= 8 and be.max_live <= 8 + len(be.lost)

                # 2. creation fails outright: once idle sandboxes are used up, leases fail fast
                be.faults = Faults(create_failure=1.0)
                keys = list(range(100, 140))
                start = anyio.current_time()
                outcomes = await gather({i: rollout(pool, i) for i in keys}, limit=16)
                counts = check_outcomes(outcomes, keys)
                assert counts.get("SandboxCreationError", 0) > 0, counts
                assert all(o.duration < LEASE_TIMEOUT for o in outcomes if isinstance(o.error, SandboxCreationError)), (
                    "a failing pool made leases wait out their deadline"
                )
                assert anyio.current_time() - start < ROLLOUT_BOUND

                # 3. the platform heals: the pool refills to its target and every rollout succeeds
                be.faults = Faults()
                with anyio.fail_after(HANG_GUARD_SECONDS):
                    while True:
                        try:
                            await pool.wait_ready(timeout_seconds=HANG_GUARD_SECONDS)
                            break
                        except SandboxCreationError:  # still cooling down after phase 2
                            await anyio.sleep(0.05)
                assert pool.statistics().idle == size
                keys = list(range(200, 240))
                outcomes = await gather({i: rollout(pool, i) for i in keys}, limit=16)
                check_outcomes(outcomes, keys, expect_ok=True)
                be.faults = ALL_FAULTS  # shutdown meets faulty destroys too
            closed_at = anyio.current_time()
        assert anyio.current_time() - closed_at < 15, "closing the session took too long"

    # 4. leaks: exactly the sandboxes whose destroy was dropped are alive, and a sweep finds them
    assert alive_ids(be) == be.lost
    assert s.sandboxes == []
    assert tasks_now() == tasks0
    stats = pool.statistics()
    assert (stats.idle, stats.leased, stats.warming, stats.waiting) == (0, 0, 0, 0)
    sweeper = FakeBackend(world=be.world)
    async with Session(SandboxDefaults(tags=tags), backend=sweeper, handle_signals=False) as s2:
        found = {info.sandbox_id for info in await s2.list()}
        assert found == be.lost
        assert set(await s2.sweep()) == found
    assert alive_ids(sweeper) == set()


@pytest.mark.parametrize("seed", range(8))
async def test_stuck_starts_never_hold_a_lease_past_its_deadline(seed: int) -> None:
    """Every create hangs or takes seconds: leases end at their deadline, typed, and nothing is left."""
    be = FakeBackend(
        seed=seed,
        create_latency=Latency.uniform(0.5, 3.0),  # all slower than the create deadline
        faults=Faults(create_hang=0.5, lost_delete=0.1),
    )
    tags = ("faults", f"stuck-seed-{seed}")
    defaults = SandboxDefaults(tags=tags, create_timeout_seconds=0.2)
    async with Session(defaults, backend=be, handle_signals=False, timeouts=TIMEOUTS) as s:
        pool = SandboxPool(
            s,
            size=2,
            max_size=4,
            create_backoff_seconds=0.01,
            create_backoff_max_seconds=0.05,
            max_consecutive_failures=1000,  # never "failing": leases must end by their own deadline
            lease_timeout_seconds=0.5,
        )
        async with pool:
            keys = list(range(12))
            with anyio.fail_after(HANG_GUARD_SECONDS):
                outcomes = await gather({i: rollout(pool, i) for i in keys}, limit=6)
            check_outcomes(outcomes, keys)
            assert all(o.kind is OutcomeKind.INFRA for o in outcomes)
            assert all(o.duration < 0.5 + 1.0 for o in outcomes), [round(o.duration, 2) for o in outcomes]
            assert pool.statistics().failures > 0 and pool.statistics().created == 0
    assert alive_ids(be) == be.lost
    async with Session(SandboxDefaults(tags=tags), backend=FakeBackend(world=be.world), handle_signals=False) as s2:
        assert set(await s2.sweep()) == be.lost
    assert not any(sb.alive for sb in be.world.values())
