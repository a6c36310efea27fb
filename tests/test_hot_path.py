"""The cheap hot path keeps the guarantees of the slow one.

Backend-call deadlines (``_deadline.bounded``: native cancellation, coalesced
timers), the exec request cache, the fast ``Outcome`` constructor, a lease's
native cancellation when its pool closes, and the FakeBackend's zero-latency fast
path: each against the behaviour it replaces.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

import anyio
import anyio.lowlevel
import pytest

from cwsandbox_async import (
    PoolClosedError,
    PoolTimeoutError,
    SandboxError,
    SandboxPool,
    SandboxStatus,
    SandboxTimeoutError,
    SandboxTransportError,
    SandboxValidationError,
    Session,
    _deadline,
)
from cwsandbox_async._deadline import bounded, call_backend
from cwsandbox_async._validate import exec_request, validate_exec
from cwsandbox_async.gatherer._outcome import Outcome, OutcomeKind, make_outcome
from cwsandbox_async.testing import FakeBackend, Faults, Latency


async def wait_until(cond: Callable[[], bool], within: float = 5.0) -> None:
    with anyio.fail_after(within):
        while not cond():  # noqa: ASYNC110 - polling is the point
            await anyio.sleep(0.002)


def in_flight() -> int:
    """Bounded calls the current loop still tracks."""
    reg = getattr(asyncio.get_running_loop(), "_cwsandbox_deadlines", None)
    return 0 if reg is None else sum(len(bucket) for bucket in reg.buckets.values())


def cancelling() -> int:
    task = asyncio.current_task()
    assert task is not None
    return task.cancelling()


async def value_after(seconds: float, value: int = 7) -> int:
    await anyio.sleep(seconds)
    return value


# -- deadlines ----------------------------------------------------------------------


async def test_a_call_that_finishes_returns_its_value_and_leaves_nothing_behind() -> None:
    assert await bounded("op", 5.0, value_after(0)) == 7
    assert await call_backend("op", 5.0, lambda: value_after(0.001, 3)) == 3
    assert in_flight() == 0 and cancelling() == 0


async def test_a_hung_call_times_out_with_an_infrastructure_error_and_the_task_is_not_left_cancelled() -> None:
    start = time.monotonic()
    with pytest.raises(SandboxTimeoutError, match=r"exec did not finish within 0\.05 s") as info:
        await bounded("exec", 0.05, asyncio.Event().wait(), sandbox_id="sbx-1")
    assert info.value.infrastructure and info.value.sandbox_id == "sbx-1"
    assert isinstance(info.value.__cause__, TimeoutError)
    assert time.monotonic() - start < 5
    assert in_flight() == 0 and cancelling() == 0
    await anyio.lowlevel.checkpoint()  # not cancelled: awaiting still works


async def test_concurrent_calls_with_different_deadlines_each_expire_on_their_own() -> None:
    results: dict[str, object] = {}

    async def one(name: str, seconds: float, work: float) -> None:
        try:
            results[name] = await bounded(name, seconds, value_after(work))
        except SandboxTimeoutError:
            results[name] = "timeout"

    async with anyio.create_task_group() as tg:
        tg.start_soon(one, "short-hangs", 0.05, 30)
        tg.start_soon(one, "short-ok", 0.05, 0)
        tg.start_soon(one, "long-ok", 5.0, 0.1)
        tg.start_soon(one, "long-hangs", 0.2, 30)
    assert results == {"short-hangs": "timeout", "short-ok": 7, "long-ok": 7, "long-hangs": "timeout"}
    assert in_flight() == 0


async def test_more_distinct_durations_than_buckets_still_get_deadlines() -> None:
    n = _deadline.MAX_BUCKETS + 8
    outcomes: list[object] = []

    async def one(i: int) -> None:
        try:
            outcomes.append(await bounded("op", 0.05 + i * 1e-4, asyncio.Event().wait()))
        except SandboxTimeoutError:
            outcomes.append("timeout")

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(one, i)
    assert outcomes == ["timeout"] * n
    assert in_flight() == 0


async def test_cancellation_from_outside_passes_through_untouched() -> None:
    with anyio.move_on_after(0.05) as scope:
        await bounded("op", 0.2, asyncio.Event().wait())
    assert scope.cancelled_caught
    assert in_flight() == 0 and cancelling() == 0

    task = asyncio.ensure_future(bounded("op", 5.0, asyncio.Event().wait()))
    await anyio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_an_outer_scope_cancelled_with_the_deadline_still_cancels() -> None:
    # The deadline and an anyio scope's deadline fall due together: whatever reaches the
    # caller, the scope is cancelled and nothing stays cancelled afterwards.
    start = time.monotonic()
    with anyio.move_on_after(0.05) as scope:
        try:
            await bounded("op", 0.05, asyncio.Event().wait())
        except SandboxTimeoutError:
            await anyio.sleep(5)  # the scope's cancellation must still land here
    assert scope.cancel_called and time.monotonic() - start < 4
    assert cancelling() == 0


async def test_a_call_that_swallows_the_cancellation_is_uncancelled() -> None:
    async def stubborn() -> int:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            return 5
        return 0

    assert await bounded("op", 0.05, stubborn()) == 5
    assert cancelling() == 0
    await anyio.lowlevel.checkpoint()


async def test_foreign_errors_are_translated_and_sandbox_errors_pass() -> None:
    async def raises(exc: BaseException) -> None:
        await anyio.lowlevel.checkpoint()
        raise exc

    with pytest.raises(SandboxTransportError, match="op failed") as info:
        await bounded("op", 5.0, raises(OSError("broken pipe")))
    assert isinstance(info.value.__cause__, OSError)
    with pytest.raises(SandboxTimeoutError):
        await bounded("op", 5.0, raises(TimeoutError()))
    original = SandboxError("mine")
    with pytest.raises(SandboxError) as caught:
        await bounded("op", 5.0, raises(original))
    assert caught.value is original

    def sync_fails() -> asyncio.Future[None]:
        raise ValueError("before any await")

    with pytest.raises(SandboxTransportError, match="before any await"):
        await call_backend("op", 5.0, sync_fails)
    assert in_flight() == 0


def test_deadlines_work_on_a_new_loop_each_time() -> None:
    for _ in range(2):
        with pytest.raises(SandboxTimeoutError):
            asyncio.run(bounded("op", 0.01, asyncio.Event().wait()))


# -- exec requests ---------------------------------------------------------------------


def request(command: object, **kw: object) -> object:
    args = {"timeout_seconds": 30.0, "cwd": "/workspace", "env": None, "stdin": None, "max_output_bytes": 1 << 20}
    args.update(kw)
    return args


@pytest.mark.parametrize(
    "command",
    [["true"], ("echo", "a b"), "echo hi; exit 3", ["python3", "-c", "x" * 10_000], ["/bin/sh", "-c", "true"]],
)
def test_cached_requests_equal_validated_ones(command: object) -> None:
    for _ in range(2):  # a miss, then a hit
        got = exec_request(command, 30.0, "/workspace/../workspace/", None, None, 1 << 20)
        want = validate_exec(
            command,
            timeout_seconds=30.0,
            cwd="/workspace/../workspace/",
            env=None,
            stdin=None,
            max_output_bytes=1 << 20,
        )
        assert got == want


@pytest.mark.parametrize(
    ("command", "timeout", "cwd", "cap"),
    [
        (["true"], True, "/workspace", 1 << 20),  # a bool is not a number of seconds (though True == 1)
        (["true"], 30.0, "/workspace", True),
        (["true"], math.nan, "/workspace", 1 << 20),
        (["true", 1], 30.0, "/workspace", 1 << 20),
        (["a\x00b"], 30.0, "/workspace", 1 << 20),
        ([], 30.0, "/workspace", 1 << 20),
        (["true"], 30.0, "relative", 1 << 20),
    ],
)
def test_bad_requests_raise_every_time(command: object, timeout: object, cwd: object, cap: object) -> None:
    exec_request(["true"], 1, "/workspace", None, None, 1)  # an equal-looking valid request is cached first
    for _ in range(2):
        with pytest.raises(SandboxValidationError):
            exec_request(command, timeout, cwd, None, None, cap)


def test_requests_with_env_or_stdin_are_validated_each_time() -> None:
    with pytest.raises(SandboxValidationError):
        exec_request(["true"], 30.0, "/workspace", {"1BAD": "x"}, None, 1 << 20)
    req = exec_request(["cat"], 30.0, "/workspace", {"A": "1"}, b"in", 1 << 20)
    assert req.env == {"A": "1"} and req.stdin == b"in"


def test_make_outcome_builds_the_same_outcome() -> None:
    err = ValueError("x")
    for args in [(0, "k", OutcomeKind.OK, [1], None, 0.5), (3, 3, OutcomeKind.ERROR, None, err, 0.0)]:
        fast, slow = make_outcome(*args), Outcome(*args)
        assert (
            type(fast) is Outcome and fast == slow and repr(fast) == repr(slow) and hash(fast.kind) == hash(slow.kind)
        )
        with pytest.raises(AttributeError):
            fast.index = 9  # type: ignore[misc]


# -- leases ------------------------------------------------------------------------------


async def test_a_lease_cut_short_by_close_leaves_its_task_uncancelled() -> None:
    be = FakeBackend(seed=3)
    async with Session(backend=be) as s:
        pool = SandboxPool(s, size=1, close_grace_seconds=0.05)
        async with pool:
            await pool.wait_ready(timeout_seconds=5)
            entered = anyio.Event()
            seen: list[object] = []

            async def holder() -> None:
                try:
                    async with pool.lease():
                        entered.set()
                        await anyio.sleep(30)
                except PoolClosedError as exc:
                    seen.append(exc)
                seen.append(cancelling())
                await anyio.sleep(0.01)  # the task goes on: nothing left cancelled
                seen.append("after")

            async with anyio.create_task_group() as tg:
                tg.start_soon(holder)
                await entered.wait()
                await pool.aclose()
        assert isinstance(seen[0], PoolClosedError) and seen[1:] == [0, "after"]
    assert be.live == 0


async def test_a_lease_cancelled_from_outside_is_not_reported_as_closed_by_the_pool() -> None:
    be = FakeBackend(seed=4)
    async with Session(backend=be) as s, SandboxPool(s, size=1, reuse=True) as pool:
        await pool.wait_ready(timeout_seconds=5)
        with anyio.move_on_after(0.05) as scope:
            async with pool.lease():
                await anyio.sleep(30)
        assert scope.cancelled_caught
        assert pool.statistics().leased == 0
        async with pool.lease() as sb:  # the pool still serves
            assert (await sb.exec(["true"])).ok


async def test_lease_fast_path_keeps_the_counters_and_gauges() -> None:
    be = FakeBackend(seed=5)
    async with Session(backend=be) as s, SandboxPool(s, size=2, max_size=2, reuse=True, check_on_lease=False) as pool:
        await pool.wait_ready(timeout_seconds=5)
        for _ in range(10):
            async with pool.lease() as sb:
                assert s.metrics.snapshot().pool_leased == 1
                await sb.exec(["true"])
        stats = pool.statistics()
        assert (stats.warm_hits, stats.cold_waits, stats.idle, stats.leased, stats.created) == (10, 0, 2, 0, 2)
        snap = s.metrics.snapshot()
        assert (snap.leases, snap.warm_hits, snap.pool_idle, snap.pool_leased, snap.executions) == (10, 10, 2, 0, 10)


# -- the fake's fast path ------------------------------------------------------------------


async def test_fake_fast_and_slow_paths_agree() -> None:
    commands: list[object] = [
        ["true"],
        ["false"],
        ["echo", "a", "b"],
        "echo out; echo err >&2; exit 3",
        ["/bin/true"],
        ["/usr/bin/nope"],
        ["nope"],
        ["printf", "x"],
        ["yes"],
        "pwd",
        ["cat"],
    ]
    fast = FakeBackend()
    slow = FakeBackend(exec_latency=Latency.constant(1e-6))  # a latency above 0 takes the general path
    async with Session(backend=fast) as s1, Session(backend=slow) as s2:
        a, b = await s1.sandbox(), await s2.sandbox()
        for command in commands:
            ra = await a.exec(command, stdin=b"in", max_output_bytes=64)
            rb = await b.exec(command, stdin=b"in", max_output_bytes=64)
            assert (ra.returncode, ra.stdout, ra.stderr, ra.truncated) == (
                rb.returncode,
                rb.stdout,
                rb.stderr,
                rb.truncated,
            )
            ra = await a.exec(command)
            rb = await b.exec(command)
            assert (ra.returncode, ra.stdout, ra.stderr, ra.truncated) == (
                rb.returncode,
                rb.stdout,
                rb.stderr,
                rb.truncated,
            )


async def test_fake_sees_faults_set_after_it_was_created_and_still_times_out_sleeps() -> None:
    be = FakeBackend()
    async with Session(backend=be) as s:
        sb = await s.sandbox()
        assert (await sb.exec(["true"])).ok
        be.faults = Faults(exec_transport_error=1.0)
        with pytest.raises(SandboxTransportError):
            await sb.exec(["true"])
        be.faults = Faults()
        assert (await sb.exec(["true"])).ok
        with pytest.raises(SandboxTimeoutError) as info:
            await sb.exec("sleep 30", timeout_seconds=0.05)
        assert info.value.result is not None and info.value.result.timed_out


class HangingStatus(FakeBackend):
    """A backend whose status call hangs while ``hang`` is set (a stuck health check)."""

    hang = True

    async def status(self, sandbox_id: str) -> SandboxStatus:
        if self.hang:
            await anyio.sleep_forever()
        return await super().status(sandbox_id)


async def test_a_hung_check_on_lease_times_the_lease_out_and_keeps_the_sandbox() -> None:
    be = HangingStatus(seed=6)
    async with Session(backend=be) as s, SandboxPool(s, size=1, max_size=1) as pool:
        await pool.wait_ready(timeout_seconds=5)
        start = time.monotonic()
        with pytest.raises(PoolTimeoutError, match=r"within 0\.1 s") as info:
            async with pool.lease(timeout_seconds=0.1):
                pass
        assert time.monotonic() - start < 5
        assert info.value.__cause__ is None and cancelling() == 0
        stats = pool.statistics()
        assert (stats.timeouts, stats.idle, stats.leased, stats.discarded) == (1, 1, 0, 0)
        be.hang = False
        async with pool.lease(timeout_seconds=5) as sb:  # the same sandbox, still good
            assert (await sb.exec(["true"])).ok
        assert pool.statistics().created == 1
