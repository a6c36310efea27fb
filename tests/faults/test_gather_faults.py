"""Seeded faults through the gatherer with a fresh sandbox per item (no pool), streaming, and early exit.

Per seed, items create their own sandbox, write a file, stream a command's output
and read the file back, on a FakeBackend failing in every way at once. Checks:
every item ends within its bound with its own result or a typed infrastructure
failure; breaking out of ``as_completed`` early cancels the rest within a bound;
afterwards only sandboxes whose destroy was dropped are alive, and a sweep finds
exactly those.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import pytest
from guards import HANG_GUARD_SECONDS

from cwsandbox_async import SandboxDefaults, SandboxNotRunningError, Session, as_completed, gather
from cwsandbox_async.testing import FakeBackend, Faults, Latency

from .conftest import TIMEOUTS, alive_ids, check_outcomes, tasks_now, virtual_time

anyio_backend = pytest.fixture(virtual_time)

SEEDS = range(20)
FAULTS = Faults(
    create_failure=0.1,
    create_hang=0.04,
    exec_transport_error=0.05,
    exec_hang=0.03,
    death_mid_exec=0.05,
    truncated_stream=0.05,
    lost_delete=0.05,
    idle_death=0.03,
    destroy_hang=0.02,
    destroy_failure=0.03,
)
ITEM_BOUND = 4.0


def item(session: Session, i: int) -> Callable[[], Awaitable[str]]:
    async def run() -> str:
        with anyio.move_on_after(ITEM_BOUND):
            async with session.sandbox() as sb:
                await sb.write_file("/workspace/n", str(i).encode())
                chunks: list[bytes] = []
                async with sb.process(["echo", str(i)], timeout_seconds=0.2) as p:
                    async for chunk in p.stdout:
                        chunks.append(chunk)
                    result = await p.wait()
                assert result.stdout == b"".join(chunks).decode()
                assert await sb.read_file("/workspace/n") == str(i).encode()
                return result.stdout
        raise AssertionError(f"item {i} outlived its {ITEM_BOUND} s bound")

    return run


def make_backend(seed: int) -> FakeBackend:
    return FakeBackend(
        seed=seed,
        create_latency=Latency.lognormal(0.002, 0.4),
        exec_latency=Latency.uniform(0.0, 0.002),
        destroy_latency=Latency.uniform(0.0, 0.002),
        faults=FAULTS,
    )


@pytest.mark.parametrize("seed", SEEDS)
async def test_gather_with_fresh_sandboxes_under_seeded_faults(seed: int) -> None:
    be = make_backend(seed)
    tags = ("faults", f"gather-seed-{seed}")
    defaults = SandboxDefaults(tags=tags, create_timeout_seconds=0.3, operation_timeout_seconds=0.3)
    tasks0 = tasks_now()
    async with Session(defaults, backend=be, handle_signals=False, timeouts=TIMEOUTS) as s:
        keys = list(range(50))
        with anyio.fail_after(HANG_GUARD_SECONDS):
            outcomes = await gather({i: item(s, i) for i in keys}, limit=12)
        counts = check_outcomes(outcomes, keys)
        assert counts.get("ok", 0) > 0 and counts.get("infra", 0) > 0, counts
        assert s.sandboxes == []

        # Leave early: the items still running are cancelled, within a bound, and clean up.
        seen = 0
        start = anyio.current_time()
        async with as_completed({i: item(s, i) for i in range(100, 150)}, limit=12) as results:
            async for outcome in results:
                seen += 1
                assert outcome.ok or outcome.infra_failure, repr(outcome.error)
                if seen == 10:
                    break
        assert anyio.current_time() - start < ITEM_BOUND * 2
        assert s.sandboxes == []
    assert alive_ids(be) == be.lost
    assert tasks_now() == tasks0
    sweeper = FakeBackend(world=be.world)
    async with Session(SandboxDefaults(tags=tags), backend=sweeper, handle_signals=False) as s2:
        assert set(await s2.sweep()) == be.lost
    assert alive_ids(sweeper) == set()


async def test_an_error_inside_a_process_block_reaches_the_caller_unwrapped() -> None:
    """``p.wait()`` "raises as Sandbox.exec would": a dead sandbox is a SandboxNotRunningError, not a group."""
    async with Session(
        backend=FakeBackend(faults=Faults(death_mid_exec=1.0)), handle_signals=False, timeouts=TIMEOUTS
    ) as s:
        sb = await s.sandbox()
        with pytest.raises(SandboxNotRunningError):
            async with sb.process(["echo", "x"]) as p:
                await p.wait()
        sb = await s.sandbox()
        with pytest.raises(KeyError):  # the caller's own exception, unchanged
            async with sb.process(["sleep", "10"]):
                raise KeyError("body")
