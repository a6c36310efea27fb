"""Session and Sandbox behaviour on FakeBackend: lifecycle, exec semantics, cleanup, list/sweep."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import looptime
import pytest
import structlog
from guards import HANG_GUARD_SECONDS

import cwsandbox_async as cwa
from cwsandbox_async.testing import FakeBackend, Faults, Latency


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    """Virtual time: the loop's clock jumps ahead when every task waits on a timer."""
    return "asyncio", {"loop_factory": looptime.new_event_loop}


def session(
    backend: FakeBackend | None = None, *, timeouts: cwa.Timeouts | None = None, **defaults: object
) -> cwa.Session:
    return cwa.Session(
        cwa.SandboxDefaults(tags=("run:test",)).with_overrides(**defaults),
        backend=backend or FakeBackend(),
        timeouts=timeouts,
    )


async def test_public_api_round_trip() -> None:
    backend = FakeBackend()
    async with session(backend) as s:
        sb = await s.sandbox()
        r = await sb.exec(["echo", "4"], timeout_seconds=30)
        assert (r.returncode, r.stdout, r.stderr, r.stdout_bytes) == (0, "4\n", "", b"4\n")
        assert r.wall_seconds >= 0 and r.command == ("echo", "4")
        await sb.write_file("/workspace/a.py", b"print(1)")
        assert await sb.read_file("/workspace/a.py") == b"print(1)"
        assert sb.sandbox_id.startswith("sbx-") and sb.tags == ("run:test",)
        assert sb.status is cwa.SandboxStatus.RUNNING
        assert sb.exec_stats["exec_count"] == 1 and sb.exec_stats["exec_completed_ok"] == 1
        await sb.stop()
        await sb.stop()  # idempotent
        assert sb.status is cwa.SandboxStatus.COMPLETED
        async with s.sandbox(tags=("extra",)) as sb2:
            assert sb2.tags == ("run:test", "extra")
        assert sb2.status is cwa.SandboxStatus.COMPLETED
    assert backend.live == 0 and backend.closed


async def test_exec_stats_follow_the_sdk() -> None:
    async with session() as s:
        sb = await s.sandbox()
        await sb.exec("exit 0")
        await sb.exec("exit 2")
        with pytest.raises(cwa.SandboxExecutionError) as info:
            await sb.exec(["false"], check=True)
        assert info.value.exec_result.returncode == 1
        with pytest.raises(cwa.SandboxTimeoutError) as tinfo:
            await sb.exec(["sleep", "30"], timeout_seconds=0.05)
        assert tinfo.value.result is not None and tinfo.value.result.timed_out
        assert tinfo.value.infrastructure is False
        assert sb.exec_stats == {
            "exec_count": 4,
            "exec_completed_ok": 1,
            "exec_completed_nonzero": 1,
            "exec_failures": 2,
        }  # each count once, under the SDK's name (the short aliases repeated them)


async def test_exec_after_stop_is_typed() -> None:
    async with session() as s:
        sb = await s.sandbox()
        await sb.stop()
        with pytest.raises(cwa.SandboxTerminatedError):
            await sb.exec(["true"])
        with pytest.raises(cwa.SandboxTerminatedError):
            await sb.read_file("/workspace/x")


async def test_dead_sandbox_raises_not_running() -> None:
    backend = FakeBackend(faults=Faults(death_mid_exec=1.0))
    async with session(backend) as s:
        sb = await s.sandbox()
        with pytest.raises(cwa.SandboxNotRunningError) as info:
            await sb.exec(["true"])
        assert info.value.infrastructure
        assert sb.status is cwa.SandboxStatus.FAILED
        with pytest.raises(cwa.SandboxNotRunningError):
            await sb.exec(["true"])
    assert backend.live == 0


async def test_a_foreign_exception_from_a_backend_is_a_bug_not_infrastructure() -> None:
    """Only a missed deadline is translated above the backend: anything else propagates, logged at ERROR."""

    def handler(argv: tuple[str, ...], stdin: bytes, files: dict[str, bytes]) -> tuple[int, bytes, bytes]:
        raise KeyError("a bug in the backend")

    async with session(FakeBackend(exec_handler=handler)) as s:
        sb = await s.sandbox()
        with structlog.testing.capture_logs() as logs, pytest.raises(KeyError):
            await sb.exec(["anything"])
        assert [e["log_level"] for e in logs if "backend bug" in e["event"]] == ["error"]
        assert s.snapshot().exec_infra_failures == 0


async def test_hung_exec_hits_the_client_deadline() -> None:
    """The client waits the exec's own timeout plus ``exec_grace_seconds``, then it is infrastructure."""
    grace = 7.0
    async with session(FakeBackend(faults=Faults(exec_hang=1.0)), timeouts=cwa.Timeouts(exec_grace_seconds=grace)) as s:
        sb = await s.sandbox()
        start = anyio.current_time()
        with pytest.raises(cwa.SandboxTimeoutError) as info:
            await sb.exec(["true"], timeout_seconds=0.5)
        assert anyio.current_time() - start == pytest.approx(0.5 + grace)
        assert info.value.infrastructure


async def test_hung_create_hits_its_deadline_and_leaves_nothing() -> None:
    backend = FakeBackend(faults=Faults(create_hang=1.0))
    async with session(backend, create_timeout_seconds=0.2) as s:
        with anyio.fail_after(HANG_GUARD_SECONDS), pytest.raises(cwa.SandboxTimeoutError):
            await s.sandbox()
        assert backend.live == 0
        assert s.sandboxes == []


async def test_failed_create_is_typed_and_cleaned() -> None:
    backend = FakeBackend(faults=Faults(create_failure=1.0))
    async with session(backend) as s:
        with pytest.raises(cwa.SandboxCreationError):
            await s.sandbox()
    assert backend.live == 0


@pytest.mark.parametrize("how", ["return", "exception", "cancel"])
async def test_session_exit_stops_everything(how: str) -> None:
    backend = FakeBackend(create_latency=Latency.constant(0.01))
    tasks_before = len(asyncio.all_tasks())

    async def body() -> None:
        async with session(backend) as s:
            for _ in range(5):
                await s.sandbox()
            # one still being created when we leave
            async with anyio.create_task_group() as tg:
                backend.create_latency = Latency.constant(10)
                tg.start_soon(s.create_sandbox)
                await anyio.sleep(0.05)
                assert backend.live == 6
                if how == "exception":
                    raise RuntimeError("boom")
                tg.cancel_scope.cancel()

    if how == "cancel":
        with anyio.move_on_after(0.2):
            backend.create_latency = Latency.constant(10)
            async with session(backend) as s:
                backend.create_latency = Latency()
                for _ in range(3):
                    await s.sandbox()
                backend.create_latency = Latency.constant(10)
                await s.sandbox()  # cancelled mid-create by move_on_after
    elif how == "exception":
        with pytest.raises(ExceptionGroup):
            await body()
    else:
        await body()
    assert backend.live == 0
    assert len(asyncio.all_tasks()) == tasks_before


async def test_list_and_sweep_find_leftovers_of_another_session() -> None:
    world: dict[str, object] = {}
    crashed = FakeBackend(world=world)  # type: ignore[arg-type]
    async with session(crashed) as s1:
        left = [await s1.sandbox() for _ in range(3)]
        s1._sandboxes.clear()  # simulate a driver that died without closing
    assert crashed.live == 3
    async with session(FakeBackend(world=world)) as s2:  # type: ignore[arg-type]
        mine = await s2.sandbox()
        found = await s2.list()
        assert {i.sandbox_id for i in found} == {sb.sandbox_id for sb in left} | {mine.sandbox_id}
        assert await s2.list(["no-such-tag"]) == []
        swept = await s2.sweep()
        assert set(swept) == {sb.sandbox_id for sb in left}
        assert [i.sandbox_id for i in await s2.list()] == [mine.sandbox_id]
        assert s2.snapshot().orphans_swept == 3
        with pytest.raises(cwa.SandboxValidationError):
            await s2.sweep(tags=())
    assert len(world) == 0


async def test_process_streams_and_kills_on_early_exit() -> None:
    backend = FakeBackend()
    async with session(backend) as s:
        sb = await s.sandbox()
        async with sb.process(["echo", "streamed"]) as p:
            chunks = [c async for c in p.stdout]
            result = await p.wait()
        assert b"".join(chunks) == b"streamed\n" == result.stdout_bytes
        assert p.returncode == 0
        async with sb.process(["sleep", "30"]) as p:
            await anyio.sleep(0.01)
        assert backend.exec_in_flight == 0


async def test_session_refuses_use_when_not_open() -> None:
    s = session()
    with pytest.raises(cwa.SandboxError):
        await s.sandbox()
    async with s:
        pass
    with pytest.raises(cwa.SandboxError):
        await s.sandbox()
    with pytest.raises(cwa.SandboxError):
        await s.open()


async def test_session_from_mapping_and_bad_backend() -> None:
    async with cwa.Session({"tags": ["a"], "exec_timeout_seconds": 5}, backend="fake") as s:
        assert s.defaults.tags == ("a",)
    with pytest.raises(cwa.SandboxValidationError):
        await cwa.Session(backend="nope").open()


async def test_session_opened_and_closed_in_different_tasks() -> None:
    s = session()
    await asyncio.get_running_loop().create_task(s.open())
    await s.sandbox()
    await asyncio.get_running_loop().create_task(s.aclose())
    assert s.state.value == "closed"
    assert s.sandboxes == []


async def test_unknown_backend_option_is_a_validation_error() -> None:
    with pytest.raises(cwa.SandboxValidationError):
        await cwa.Session(backend="fake", backend_options={"bogus": 1}).open()
