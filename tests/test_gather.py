"""The gatherer: as_completed, gather, gather_groups and wait, on real tasks and on FakeBackend sandboxes.

Virtual time (looptime): the loop's clock jumps ahead whenever every task waits on a
timer, so deadlines and sleeps cost no wall-clock time and bounds are exact on the
loop's clock (``anyio.current_time()``).
"""

from __future__ import annotations

import asyncio
import functools
import gc
import itertools
import subprocess
import sys
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import anyio
import anyio.lowlevel
import looptime
import pytest
from guards import HANG_GUARD_SECONDS

import cwsandbox_async as cwa
from cwsandbox_async import OutcomeKind
from cwsandbox_async.testing import FakeBackend, Faults


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return "asyncio", {"loop_factory": looptime.new_event_loop}


class Abort(BaseException):
    """A KeyboardInterrupt-style exception (not an Exception) that must never become a value."""


def no_task_leak(test: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    """Fail the test if it leaves a task running."""

    @functools.wraps(test)
    async def wrapper(*args: Any, **kwargs: Any) -> None:
        before = asyncio.all_tasks()
        await test(*args, **kwargs)
        await anyio.lowlevel.checkpoint()
        leaked = asyncio.all_tasks() - before
        assert leaked == set(), f"tasks left running: {leaked}"

    return wrapper


def sleeper(seconds: float, value: Any = None, log: list[str] | None = None) -> Callable[[], Awaitable[Any]]:
    """A factory for work that sleeps, records 'cancelled' if it is cancelled, and returns ``value``."""

    async def work() -> Any:
        try:
            await anyio.sleep(seconds)
        except anyio.get_cancelled_exc_class():
            if log is not None:
                log.append("cancelled")
            raise
        return value

    return work


class Gauge:
    """Counts items running at once, from inside the work itself."""

    def __init__(self) -> None:
        self.now = 0
        self.max = 0
        self.done = 0

    def item(self, checkpoints: int = 2) -> Callable[[], Awaitable[int]]:
        async def work() -> int:
            self.now += 1
            self.max = max(self.max, self.now)
            try:
                for _ in range(checkpoints):
                    await anyio.lowlevel.checkpoint()
            finally:
                self.now -= 1
            self.done += 1
            return 1

        return work


# -- order, bounds, laziness -----------------------------------------------------


@no_task_leak
async def test_outcomes_come_out_fastest_first() -> None:
    delays = {"slow": 0.9, "fast": 0.0, "mid": 0.6, "quick": 0.3}
    work = {name: sleeper(d, value=name) for name, d in delays.items()}
    async with cwa.as_completed(work, limit=10) as results:
        seen = [o async for o in results]
    assert [o.key for o in seen] == ["fast", "quick", "mid", "slow"]
    assert [o.value for o in seen] == ["fast", "quick", "mid", "slow"]
    assert [o.index for o in seen] == [1, 3, 2, 0]
    assert all(o.ok and o.kind is OutcomeKind.OK and o.error is None for o in seen)
    slow = seen[-1]
    assert 0.8 < slow.duration < 5


@no_task_leak
async def test_gather_returns_input_order_with_keys() -> None:
    outcomes = await cwa.gather([("b", sleeper(0.2, 2)), ("a", sleeper(0.0, 1))])
    assert [(o.index, o.key, o.value) for o in outcomes] == [(0, "b", 2), (1, "a", 1)]
    plain = await cwa.gather([sleeper(0.1, "x"), sleeper(0.0, "y")])
    assert [(o.index, o.key, o.unwrap()) for o in plain] == [(0, 0, "x"), (1, 1, "y")]


@no_task_leak
async def test_in_flight_bound_holds_under_10000_items() -> None:
    gauge = Gauge()
    async with cwa.as_completed((gauge.item() for _ in range(10_000)), limit=64) as results:
        count = 0
        async for outcome in results:
            assert outcome.ok
            count += 1
            assert gauge.now <= 64
        stats = results.statistics
    assert count == gauge.done == 10_000
    assert gauge.max == 64  # the bound is reached and never passed
    assert stats.max_in_flight == 64 and stats.workers <= 64 and stats.pulled == stats.completed == 10_000


@no_task_leak
async def test_input_is_pulled_lazily_from_a_million_factories() -> None:
    pulled = 0
    limit = 32
    gauge = Gauge()

    def factories() -> Iterator[Callable[[], Awaitable[int]]]:
        nonlocal pulled
        for _ in range(1_000_000):
            pulled += 1
            yield gauge.item(checkpoints=1)

    consumed = 0
    async with cwa.as_completed(factories(), limit=limit) as results:
        async for _ in results:
            consumed += 1
            # pulled but not consumed: running, or finished and waiting in the stream's buffer (size limit)
            assert pulled - consumed <= 2 * limit + 1
            if consumed == 20_000:
                break
    assert pulled <= 20_000 + 2 * limit + 1
    assert gauge.now == 0  # what was still running was cancelled and waited for


@pytest.mark.slow  # 110,000 items under tracemalloc: scale
async def test_memory_stays_flat_as_the_input_grows() -> None:
    async def noop() -> None:
        return None

    async def peak(n: int) -> int:
        gc.collect()
        tracemalloc.start()
        try:
            consumed = 0
            async with cwa.as_completed(itertools.repeat(noop, n), limit=128) as results:
                async for _ in results:
                    consumed += 1
            assert consumed == n
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    small, large = await peak(10_000), await peak(100_000)
    # 10x the items, same memory: only what is in flight is held (a list of 100,000 outcomes is ~15 MB)
    assert large < small * 1.5 + 256 * 1024, (small, large)
    assert large < 4 * 1024 * 1024


# -- deadlines, errors as values, cancellation ---------------------------------------


@no_task_leak
async def test_an_item_past_its_deadline_is_cancelled_and_times_out() -> None:
    log: list[str] = []
    start = anyio.current_time()
    outcomes = await cwa.gather([sleeper(30, log=log), sleeper(0.0, "ok")], timeout_seconds=0.3)
    assert anyio.current_time() - start < 10
    late, fine = outcomes
    assert late.kind is OutcomeKind.TIMEOUT and not late.ok and late.value is None
    assert isinstance(late.error, cwa.SandboxTimeoutError) and late.error.infrastructure is False
    assert late.duration >= 0.25
    assert log == ["cancelled"]
    assert fine.kind is OutcomeKind.OK and fine.value == "ok"
    with pytest.raises(cwa.SandboxTimeoutError):
        late.unwrap()


@no_task_leak
async def test_one_failure_does_not_cancel_the_others() -> None:
    log: list[str] = []

    async def boom() -> None:
        raise ValueError("bad completion")

    outcomes = await cwa.gather([boom, sleeper(0.3, 1, log), sleeper(0.3, 2, log), boom()], limit=2)
    assert [o.kind for o in outcomes] == [OutcomeKind.ERROR, OutcomeKind.OK, OutcomeKind.OK, OutcomeKind.ERROR]
    assert [o.value for o in outcomes[1:3]] == [1, 2] and log == []
    assert isinstance(outcomes[0].error, ValueError) and not outcomes[0].infra_failure
    with pytest.raises(ValueError, match="bad completion"):
        outcomes[3].unwrap()


@no_task_leak
async def test_breaking_out_early_cancels_and_waits_for_the_rest() -> None:
    log: list[str] = []
    work = [sleeper(0.0, "first")] + [sleeper(30, log=log) for _ in range(5)]
    start = anyio.current_time()
    async with cwa.as_completed(work, limit=10) as results:
        async for outcome in results:
            assert outcome.value == "first"
            break
    assert anyio.current_time() - start < 10
    assert log == ["cancelled"] * 5  # every running item saw its cancellation before the block returned
    with anyio.move_on_after(0.2):  # the caller's own scopes still work: no stray cancellation
        await anyio.sleep(0.01)
    with pytest.raises(cwa.SandboxError, match="closed"):
        await results.__anext__()


@no_task_leak
async def test_an_exception_in_the_block_propagates_unwrapped() -> None:
    log: list[str] = []

    async def consume() -> None:
        async with cwa.as_completed([sleeper(30, log=log), sleeper(0.0)]) as results:
            async for _ in results:
                raise KeyError("mine")

    with pytest.raises(KeyError, match="mine"):
        await consume()
    assert log == ["cancelled"]


@no_task_leak
async def test_unread_coroutines_are_closed_on_early_exit() -> None:
    coros = [sleeper(0.0, i)() for i in range(50)]
    async with cwa.as_completed(coros, limit=2) as results:
        async for _ in results:
            break
    gc.collect()  # an unawaited, unclosed coroutine would warn here (warnings are errors)
    assert all(c.cr_frame is None for c in coros)  # every one ran or was closed


@no_task_leak
async def test_cancelling_the_caller_cancels_everything_and_reraises() -> None:
    log: list[str] = []
    with anyio.move_on_after(0.3) as scope:
        await cwa.gather([sleeper(30, log=log) for _ in range(4)])
    assert scope.cancelled_caught and log == ["cancelled"] * 4

    log.clear()
    task = asyncio.get_running_loop().create_task(cwa.gather([sleeper(30, log=log) for _ in range(3)], limit=2))
    await anyio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert log == ["cancelled"] * 2  # the two in flight; the third never started


@no_task_leak
async def test_a_base_exception_from_an_item_propagates() -> None:
    log: list[str] = []

    async def abort() -> None:
        await anyio.sleep(0.05)
        raise Abort

    with pytest.raises(Abort):
        await cwa.gather([sleeper(30, log=log), abort, sleeper(30, log=log)])
    assert log == ["cancelled", "cancelled"]

    async def consume() -> None:
        async with cwa.as_completed([abort, sleeper(30, log=log)]) as results:
            async for _ in results:
                pass

    with pytest.raises(Abort):
        await consume()
    assert log == ["cancelled"] * 3


@pytest.mark.e2e  # a child interpreter
def test_keyboard_interrupt_from_an_item_reaches_the_caller() -> None:
    # In a child interpreter: asyncio lets a KeyboardInterrupt raised in a task escape the event loop
    # itself, which is not something to do inside the test runner's own process.
    code = """
import asyncio, cwsandbox_async as cwa
log = []
async def interrupt():
    await asyncio.sleep(0.01)
    raise KeyboardInterrupt
async def other():
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        log.append("cancelled")
        raise
try:
    asyncio.run(cwa.gather([interrupt, other]))
except KeyboardInterrupt:
    print("interrupted", log)
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_GUARD_SECONDS, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "interrupted ['cancelled']"


@no_task_leak
async def test_work_cancelled_by_someone_else_is_a_cancelled_outcome() -> None:
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[int] = loop.create_future()
    loop.call_later(0.05, fut.cancel)

    async def waits_on_future() -> int:
        return await fut

    [outcome] = await cwa.gather([waits_on_future])
    assert outcome.kind is OutcomeKind.CANCELLED
    assert isinstance(outcome.error, asyncio.CancelledError)


# -- inputs and validation -------------------------------------------------------------


@no_task_leak
async def test_async_iterable_input_and_bad_items() -> None:
    async def source() -> AsyncIterator[Any]:
        yield sleeper(0.0, "a")
        yield 42  # not awaitable
        yield (1, 2, 3)  # not a (key, work) pair
        yield lambda: "sync result"  # a callable that does not return an awaitable
        yield ("k", sleeper(0.0, "b"))

    outcomes = await cwa.gather(source(), limit=2)
    assert [o.kind for o in outcomes] == [OutcomeKind.OK] + [OutcomeKind.ERROR] * 3 + [OutcomeKind.OK]
    assert all(isinstance(o.error, cwa.SandboxValidationError) for o in outcomes[1:4])
    assert outcomes[4].key == "k" and outcomes[4].value == "b"


@no_task_leak
async def test_an_input_that_raises_is_raised_from_the_iteration() -> None:
    log: list[str] = []

    def broken() -> Iterator[Callable[[], Awaitable[Any]]]:
        yield sleeper(30, log=log)
        raise LookupError("dataset ran dry")

    async def consume() -> None:
        async with cwa.as_completed(broken()) as results:
            async for _ in results:
                pass

    with pytest.raises(LookupError, match="ran dry"):
        await consume()
    assert log == ["cancelled"]
    start = anyio.current_time()
    with pytest.raises(LookupError, match="ran dry"):
        await cwa.gather(broken())
    assert log == ["cancelled"] * 2 and anyio.current_time() - start < 10


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"work": 3}, "iterable"),
        ({"work": "abc"}, "not str"),
        ({"work": [], "limit": 0}, "limit"),
        ({"work": [], "limit": True}, "limit"),
        ({"work": [], "timeout_seconds": -1}, "timeout_seconds"),
        ({"work": [], "timeout_seconds": float("nan")}, "timeout_seconds"),
    ],
)
async def test_bad_arguments_raise_validation_errors(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(cwa.SandboxValidationError, match=match):
        await cwa.gather(**kwargs)


async def test_empty_input() -> None:
    assert await cwa.gather([]) == []
    assert (await cwa.gather_groups({})).by_group == {}


@pytest.mark.parametrize("groups", [[1, 2], {"g": "abc"}, {"g": 3}])
async def test_gather_groups_validates_its_input(groups: Any) -> None:
    with pytest.raises(cwa.SandboxValidationError, match="group"):
        await cwa.gather_groups(groups)


# -- metrics, progress -----------------------------------------------------------------


async def test_metrics_and_progress_see_every_outcome(capsys: pytest.CaptureFixture[str]) -> None:
    events: list[tuple[str, float]] = []

    class Sink:
        def gather_outcome(self, kind: str, duration: float) -> None:
            events.append((kind, duration))

    async def boom() -> None:
        raise RuntimeError

    await cwa.gather([sleeper(0.0), boom], metrics=Sink(), progress=True)
    assert sorted(k for k, _ in events) == ["error", "ok"] and all(d >= 0 for _, d in events)
    assert "2/2" in capsys.readouterr().err  # tqdm's bar, on stderr
    await cwa.gather([sleeper(0.0)], progress=None)  # stdout is not a terminal under pytest: no bar
    assert capsys.readouterr().err == ""


async def test_session_metrics_count_gather_outcomes() -> None:
    async def boom() -> None:
        raise RuntimeError

    async with cwa.Session(backend=FakeBackend()) as s:
        await cwa.gather([sleeper(0.0, 1), boom, sleeper(0.0, 2)], metrics=s.metrics)
        assert dict(s.metrics.snapshot().gather) == {"ok": 2, "error": 1}


# -- real sandboxes ----------------------------------------------------------------------


@no_task_leak
async def test_sandbox_failures_are_classified() -> None:
    backend = FakeBackend(seed=7, faults=Faults(exec_transport_error=0.3, death_mid_exec=0.1))
    async with cwa.Session(backend=backend) as session:

        def run(cmd: str, **kw: Any) -> Callable[[], Awaitable[cwa.ExecResult]]:
            async def work() -> cwa.ExecResult:
                async with session.sandbox() as sb:
                    return await sb.exec(cmd, **kw)

            return work

        work = [run("echo hi") for _ in range(60)]
        work += [run("exit 3", check=True), run("sleep 30", timeout_seconds=0.1)]
        outcomes = await cwa.gather(work, limit=16)
    assert backend.live == 0
    plain = outcomes[:60]
    infra = [o for o in plain if o.kind is OutcomeKind.INFRA]
    assert 5 < len(infra) < 50  # ~37% injected failures over 60 seeded draws
    assert all(o.infra_failure and isinstance(o.error, cwa.SandboxError) and o.error.infrastructure for o in infra)
    assert all(o.value is not None and o.value.stdout == "hi\n" for o in plain if o.ok)
    assert len(infra) + sum(o.ok for o in plain) == 60
    failed, slow = outcomes[60:]
    # each of these may also have hit an injected fault; if not, it is the program's outcome
    assert failed.kind in (OutcomeKind.ERROR, OutcomeKind.INFRA)
    if failed.kind is OutcomeKind.ERROR:
        assert isinstance(failed.error, cwa.SandboxExecutionError)
    assert slow.kind in (OutcomeKind.TIMEOUT, OutcomeKind.INFRA)
    if slow.kind is OutcomeKind.TIMEOUT:
        assert isinstance(slow.error, cwa.SandboxTimeoutError) and not slow.infra_failure


async def test_gather_groups_gives_per_group_lists_and_an_infra_mask() -> None:
    async def infra() -> None:
        raise cwa.SandboxTransportError("agent died")

    async def fails() -> None:
        raise cwa.SandboxExecutionError("tests failed", exec_result=None)  # type: ignore[arg-type]

    groups = {
        "p0": [sleeper(0.2, 0.0), infra, sleeper(0.0, 1.0)],
        "p1": (w for w in [fails, sleeper(0.1, 0.5)]),  # a lazy group
        "p2": [],
    }
    grouped = await cwa.gather_groups(groups, limit=2)
    assert list(grouped) == ["p0", "p1", "p2"] and len(grouped) == 3
    assert [o.value for o in grouped["p0"]] == [0.0, None, 1.0]
    assert [o.key for o in grouped["p0"]] == [("p0", 0), ("p0", 1), ("p0", 2)]
    assert grouped.infra_mask == {"p0": [False, True, False], "p1": [False, False], "p2": []}
    assert grouped.infra_count == 1
    assert [o.kind for o in grouped["p1"]] == [OutcomeKind.ERROR, OutcomeKind.OK]


def test_classify_error() -> None:
    from cwsandbox_async.gatherer._outcome import classify_error

    timeout_prog = cwa.SandboxTimeoutError("exec", infrastructure=False)
    timeout_infra = cwa.SandboxTimeoutError("create")
    assert classify_error(timeout_prog) is OutcomeKind.TIMEOUT
    assert classify_error(timeout_infra) is OutcomeKind.INFRA
    assert classify_error(TimeoutError()) is OutcomeKind.TIMEOUT
    assert classify_error(cwa.SandboxValidationError("x")) is OutcomeKind.ERROR
    assert classify_error(cwa.SandboxFileError("x")) is OutcomeKind.ERROR
    assert classify_error(cwa.SandboxNotRunningError("x")) is OutcomeKind.INFRA
    assert classify_error(ExceptionGroup("g", [ValueError(), cwa.SandboxTransportError("x")])) is OutcomeKind.INFRA
    assert classify_error(ExceptionGroup("g", [TimeoutError(), timeout_prog])) is OutcomeKind.TIMEOUT
    assert classify_error(ExceptionGroup("g", [TimeoutError(), ValueError()])) is OutcomeKind.ERROR


# -- wait: the CoreWeave SDK's semantics -----------------------------------------------


@no_task_leak
async def test_wait_returns_the_first_done_and_leaves_the_rest_running() -> None:
    tasks = [asyncio.create_task(sleeper(d, d)()) for d in (0.6, 0.0, 0.3)]
    done, pending = await cwa.wait(tasks, num_returns=1)
    assert done == [tasks[1]] and pending == [tasks[0], tasks[2]]
    assert not any(t.cancelled() or t.done() for t in pending)
    done, pending = await cwa.wait(pending)  # num_returns=None: all
    assert done == [tasks[2], tasks[0]] and pending == []  # completion order
    assert [t.result() for t in tasks] == [0.6, 0.0, 0.3]


@no_task_leak
async def test_wait_timeout_returns_what_is_done_without_cancelling() -> None:
    fast, slow = asyncio.create_task(sleeper(0.0, 1)()), asyncio.create_task(sleeper(30)())
    start = anyio.current_time()
    done, pending = await cwa.wait([slow, fast], timeout=0.3)
    assert anyio.current_time() - start < 10
    assert done == [fast] and pending == [slow] and not slow.cancelled()
    done, pending = await cwa.wait([slow], timeout=0)  # poll
    assert (done, pending) == ([], [slow])
    slow.cancel()
    with pytest.raises(asyncio.CancelledError):
        await slow


@no_task_leak
async def test_wait_moves_extra_done_items_to_pending() -> None:
    tasks = [asyncio.create_task(sleeper(0.0, i)()) for i in range(4)]
    await asyncio.gather(*tasks)
    done, pending = await cwa.wait(tasks, num_returns=2)
    assert done == tasks[:2] and pending == tasks[2:]
    assert all(t.done() for t in pending)
    assert await cwa.wait([]) == ([], [])
    done, pending = await cwa.wait(tasks, num_returns=10)  # more than given: all of them
    assert done == tasks and pending == []


async def test_wait_counts_failures_as_done_and_validates() -> None:
    async def fail() -> None:
        raise ValueError

    failing = asyncio.create_task(fail())
    done, _ = await cwa.wait([failing])
    assert done == [failing] and isinstance(failing.exception(), ValueError)
    for bad in (0, -1, True):
        with pytest.raises(cwa.SandboxValidationError, match="num_returns"):
            await cwa.wait([failing], num_returns=bad)
    with pytest.raises(ValueError, match="timeout"):  # SandboxValidationError is a ValueError, like the SDK's
        await cwa.wait([failing], timeout=-1)
    coro = fail()
    with pytest.raises(cwa.SandboxValidationError, match="create_task"):
        await cwa.wait([coro])
    coro.close()


async def test_wait_on_sandboxes_and_processes() -> None:
    async with cwa.Session(backend=FakeBackend()) as session:
        sb = await session.sandbox()
        assert await cwa.wait([sb]) == ([sb], [])
        async with sb.process(["sleep", "0.2"]) as slow, sb.process(["echo", "x"]) as quick:
            done, pending = await cwa.wait([slow, quick], num_returns=1, timeout=HANG_GUARD_SECONDS)
            assert done == [quick] and pending == [slow]
            done, pending = await cwa.wait([slow, quick], timeout=HANG_GUARD_SECONDS)
            assert set(map(id, done)) == {id(slow), id(quick)} and pending == []
            assert (await slow.wait()).returncode == 0


async def test_a_generator_read_to_its_end_is_refused_not_run_as_nothing() -> None:
    """The README once gave one generator to as_completed and then to gather: the second got []."""

    async def one() -> int:
        return 1

    work = (one for _ in range(3))
    assert [o.value for o in await cwa.gather(work)] == [1, 1, 1]
    with pytest.raises(cwa.SandboxValidationError, match="already read to its end"):
        await cwa.gather(work)
    async with cwa.as_completed(iter([])) as results:  # an empty iterator is still fine
        assert [o async for o in results] == []
