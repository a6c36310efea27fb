"""Failure classes decided where the facts are: starved timeouts, OOM kills, CPU budgets, exclusive execs,
caller mistakes, and how outcomes, ``gather_groups``, metrics and the TRL reward carry them.

The FakeBackend reports the facts (seeded OOM kills and starvation, handler-given CPU
and wait times); the rule that turns them into a verdict is the Sandbox layer's
(``_verdict``), the same for every backend.
"""

from __future__ import annotations

import math
import os
from typing import Any

import anyio
import pytest
from guards import HANG_GUARD_SECONDS

import cwsandbox_async as cwa
from cwsandbox_async import OutcomeKind, SandboxDefaults
from cwsandbox_async._verdict import is_starved
from cwsandbox_async.integrations.art import run_tool
from cwsandbox_async.integrations.trl import code_reward
from cwsandbox_async.testing import ExecExit, FakeBackend, Faults

CPUS = len(os.sched_getaffinity(0))


def timed_out(cpu: float, wait: float | None, sandbox_cpu: Any = ..., wall: float = 2.0, others: Any = ...) -> ExecExit:
    """A timed-out exit; the sandbox's CPU is the command's own unless given (``None``: not measured);
    the rest of the machine kept every CPU busy unless ``others`` says otherwise."""
    sandbox = cpu if sandbox_cpu is ... else sandbox_cpu
    rest = CPUS * wall - cpu if others is ... else others
    return ExecExit(
        -9, b"", b"", wall, cpu, timed_out=True, cpu_wait_seconds=wait, sandbox_cpu_seconds=sandbox,
        others_cpu_seconds=rest,
    )  # fmt: skip


DEFAULTS = SandboxDefaults()


@pytest.mark.parametrize(
    ("case", "ex", "starved"),
    [
        ("starved: little CPU, long run-queue wait", timed_out(cpu=0.1, wait=1.8), True),
        ("an infinite loop alone: it used its CPU", timed_out(cpu=1.95, wait=0.02), False),
        ("a program that only sleeps: no run-queue wait", timed_out(cpu=0.0, wait=0.0), False),
        # `sleep 30` under a 1 s timeout at load 37 (seen): its start waited 0.40 s, then it slept
        ("a sleeper whose start waited, then slept longer", timed_out(cpu=0.01, wait=0.40, wall=1.0), False),
        ("waited most of the time it was not running", timed_out(cpu=0.01, wait=0.55, wall=1.0), True),
        ("no wait measured: never starved", timed_out(cpu=0.1, wait=None), False),
        ("no sandbox CPU measured: never starved", timed_out(cpu=0.1, wait=1.8, sandbox_cpu=None), False),
        ("its own busy children: the tree used the CPU", timed_out(cpu=1.9, wait=5.0), False),
        ("daemons it left burn the sandbox's CPU", timed_out(cpu=0.1, wait=1.8, sandbox_cpu=1.9), False),
        ("little wait: blocked on something else", timed_out(cpu=0.1, wait=0.2), False),
        ("its own tasks waited for each other on an idle machine", timed_out(cpu=0.1, wait=1.8, others=0.05), False),
        ("others used half of what it left: not starved", timed_out(cpu=0.1, wait=1.8, others=CPUS - 0.05), False),
        ("others not measured: never starved", timed_out(cpu=0.1, wait=1.8, others=None), False),
        ("it did not time out", ExecExit(1, b"", b"", 2.0, 0.1, cpu_wait_seconds=1.8, sandbox_cpu_seconds=0.1), False),
    ],
)
def test_starvation_needs_both_a_small_cpu_share_and_run_queue_wait(case: str, ex: ExecExit, starved: bool) -> None:
    assert is_starved(ex, DEFAULTS) is starved, case


def test_starvation_thresholds_are_settings_and_follow_the_cpu_limit() -> None:
    ex = timed_out(cpu=0.3, wait=1.5)  # 15% of a core
    assert is_starved(ex, DEFAULTS)
    assert not is_starved(ex, DEFAULTS.with_overrides(starved_cpu_share=0.1))
    assert not is_starved(ex, DEFAULTS.with_overrides(starved_cpu_share=0.0))  # off
    assert not is_starved(ex, DEFAULTS.with_overrides(starved_wait_share=0.9))
    # a sandbox limited to a quarter of a core is entitled to 0.25: 15% of a core is 60% of that
    assert not is_starved(ex, DEFAULTS.with_overrides(resources=cwa.Resources(cpu=0.25)))
    for bad in ({"starved_cpu_share": 1.5}, {"starved_cpu_share": -0.1}, {"starved_wait_share": math.inf}):
        with pytest.raises(cwa.SandboxValidationError):
            DEFAULTS.with_overrides(**bad)
    with pytest.raises(cwa.SandboxValidationError):
        DEFAULTS.with_overrides(starved_wait_share="0.5")


# -- through a Session ----------------------------------------------------------------------


async def test_a_starved_timeout_is_infrastructure_an_ordinary_one_is_the_programs() -> None:
    backend = FakeBackend(faults=Faults(starve=1.0))
    async with cwa.Session(backend=backend) as session, session.sandbox() as sb:
        with pytest.raises(cwa.SandboxTimeoutError) as info:
            await sb.exec(["true"], timeout_seconds=0.05)
        assert info.value.infrastructure and "starved of CPU" in str(info.value)
        result = info.value.result
        assert result is not None and result.starved and result.timed_out and result.cpu_wait_seconds
        backend.faults = Faults()
        with pytest.raises(cwa.SandboxTimeoutError) as info:
            await sb.exec(["sleep", "5"], timeout_seconds=0.05)
        assert not info.value.infrastructure and info.value.result is not None and not info.value.result.starved
        snap = session.snapshot().as_dict()
    assert snap["cwsandbox/exec_timeouts"] == 2
    assert snap["cwsandbox/exec_starved"] == 1
    assert snap["cwsandbox/exec_infra_failures"] == 1


async def test_outcomes_and_gather_groups_carry_starvation() -> None:
    backend = FakeBackend()
    async with cwa.Session(backend=backend) as session, session.sandbox() as sb:

        async def run(starve: bool) -> int:
            backend.faults = Faults(starve=1.0 if starve else 0.0)
            return (await sb.exec(["sleep", "5"] if not starve else ["true"], timeout_seconds=0.05)).returncode

        grouped = await cwa.gather_groups({"p": [lambda: run(True), lambda: run(False)]}, limit=1)
    kinds = [o.kind for o in grouped["p"]]
    assert kinds == [OutcomeKind.STARVED, OutcomeKind.TIMEOUT]
    assert grouped.infra_mask == {"p": [True, False]}
    assert grouped.infra_count == 1 and grouped.starved_count == 1
    assert grouped["p"][0].infra_failure and not grouped["p"][1].infra_failure


async def test_an_oom_kill_is_a_result_counted_in_metrics() -> None:
    async with cwa.Session(backend=FakeBackend(faults=Faults(oom_kill=1.0))) as session, session.sandbox() as sb:
        result = await sb.exec(["echo", "partial"])
        assert result.oom_killed and result.returncode == -9 and not result.ok
        tool = await run_tool(sb, {"name": "bash", "arguments": '{"command": "echo hi"}'})
        assert not tool.ok and tool.observation.startswith("Error (killed: out of memory)")
        assert session.snapshot().as_dict()["cwsandbox/exec_oom_killed"] == 2


async def test_cpu_budget_is_passed_enforced_and_validated() -> None:
    seen: list[Any] = []

    def burner(argv: tuple[str, ...], stdin: bytes, files: dict[str, bytes]) -> ExecExit:
        return ExecExit(0, b"done\n", b"", wall_seconds=3.0, cpu_seconds=3.0)

    backend = FakeBackend(exec_handler=burner)
    original = backend.exec

    async def recording(sandbox_id: str, request: Any, on_output: Any = None) -> ExecExit:
        seen.append(request)
        return await original(sandbox_id, request, on_output)

    backend.exec = recording  # type: ignore[method-assign]  # record the requests the Sandbox sends
    async with cwa.Session(backend=backend) as session, session.sandbox() as sb:
        over = await sb.exec(["burn"], cpu_seconds=1)
        assert over.cpu_exceeded and over.returncode == -9 and over.cpu_seconds == 1.0
        within = await sb.run_python("pass", cpu_seconds=10, exclusive=True)
        assert within.returncode == 0 and not within.cpu_exceeded
        assert [(r.cpu_seconds, r.exclusive) for r in seen] == [(1.0, False), (10.0, True)]
        for bad in (0, -1, math.nan, math.inf, True, "1"):
            with pytest.raises(cwa.SandboxValidationError):
                await sb.exec(["true"], cpu_seconds=bad)  # type: ignore[arg-type]  # bad on purpose
        with pytest.raises(cwa.SandboxValidationError):
            await sb.exec(["true"], exclusive=1)  # type: ignore[arg-type]  # bad on purpose


async def test_tool_observations_name_the_kill() -> None:
    def limited(argv: tuple[str, ...], stdin: bytes, files: dict[str, bytes]) -> ExecExit:
        return ExecExit(-9, b"partial\n", b"", wall_seconds=1.0, cpu_seconds=1.0, cpu_exceeded=True)

    async with cwa.Session(backend=FakeBackend(exec_handler=limited)) as session, session.sandbox() as sb:
        res = await run_tool(sb, {"name": "bash", "arguments": '{"command": "spin"}'})
    assert not res.ok and res.observation == "Error (killed: CPU time limit exceeded):\npartial"


async def started(backend: FakeBackend) -> None:
    """Wait until the backend runs one exec (a ``process`` started in the background)."""
    with anyio.fail_after(HANG_GUARD_SECONDS):
        while not backend.exec_in_flight:  # noqa: ASYNC110 - polling the fake's own counter
            await anyio.sleep(0.001)


async def test_an_exclusive_exec_kills_every_other_exec_first() -> None:
    backend = FakeBackend()
    async with cwa.Session(backend=backend) as session, session.sandbox() as sb:
        async with sb.process(["sleep", "30"]) as server:  # e.g. a server the episode started
            await started(backend)
            result = await sb.exec(["echo", "tests"], exclusive=True)
            assert result.stdout == "tests\n"
            with anyio.fail_after(HANG_GUARD_SECONDS):
                ended = await server.wait()
        assert ended.returncode == -9 and backend.exclusive_kills == 1
        plain = await sb.exec(["true"])
        assert plain.ok and backend.exclusive_kills == 1


@pytest.mark.e2e  # the fake backend runs these programs as processes
async def test_submit_solution_runs_exclusive_so_a_leftover_process_is_killed() -> None:
    backend = FakeBackend(exec_handler=_host)
    async with cwa.Session(backend=backend) as session, session.sandbox() as sb, sb.process(["sleep", "30"]) as left:
        await started(backend)
        res = await run_tool(
            sb,
            {"name": "submit_solution", "arguments": '{"code": "def f(): return 1"}'},
            tests="assert f() == 1",
        )
        assert res.passed is True
        with anyio.fail_after(HANG_GUARD_SECONDS):
            assert (await left.wait()).returncode == -9
    assert backend.exclusive_kills == 1


async def _host(argv: tuple[str, ...], stdin: bytes, files: dict[str, bytes]) -> tuple[int, bytes, bytes]:
    result = await anyio.run_process(list(argv), check=False, input=stdin or None)
    return result.returncode, result.stdout, result.stderr


# -- the TRL reward ------------------------------------------------------------------------


@pytest.mark.e2e  # the fake backend runs these programs as processes
async def test_reward_starved_is_none_with_a_count_oom_is_zero(capsys: pytest.CaptureFixture[str]) -> None:
    starved = code_reward(pool_size=0, backend=FakeBackend(faults=Faults(starve=1.0)), timeout_seconds=0.05)
    oom = code_reward(pool_size=0, backend=FakeBackend(exec_handler=_host, faults=Faults(oom_kill=1.0)))
    metrics: dict[str, float] = {}
    try:
        assert await starved(completions=["<answer>pass</answer>"] * 2, log_metric=metrics.__setitem__) == [None, None]
        assert starved.last_stats is not None and starved.last_stats.starved == 2
        assert metrics["cwsandbox/sandbox_reward/starved"] == 2.0  # cwsandbox/<reward name>/...
        assert await oom(completions=["<answer>print(1)</answer>"]) == [0.0]
        assert oom.last_stats is not None and oom.last_stats.oom_killed == 1
    finally:
        await starved.aclose()
        await oom.aclose()
    out = capsys.readouterr().out
    assert "2 infra failures (not scored; 2 starved of CPU)" in out
    assert "0/1 passed, 0 skipped (no code), 1 out of memory" in out


# -- caller mistakes and the death of a sandbox ---------------------------------------------------


async def test_caller_mistakes_are_not_infrastructure() -> None:
    session = cwa.Session(backend=FakeBackend())
    with pytest.raises(cwa.SandboxError) as info:
        await session.sandbox()  # not opened
    assert not info.value.infrastructure
    with pytest.raises(cwa.SandboxError) as no_backend:
        _ = session.backend
    assert not no_backend.value.infrastructure
    async with session:
        sb = await session.sandbox()
        await sb.stop()
        with pytest.raises(cwa.SandboxTerminatedError) as stopped:
            await sb.exec(["true"])
        assert not stopped.value.infrastructure
    with pytest.raises(cwa.SandboxError) as closed:
        await session.sandbox()
    assert not closed.value.infrastructure
    with pytest.raises(cwa.SandboxError) as reopened:
        async with session:
            pass
    assert not reopened.value.infrastructure


@pytest.mark.parametrize("infrastructure", [False, True])
async def test_whoever_killed_the_sandbox_owns_every_later_call(infrastructure: bool) -> None:
    def dies(argv: tuple[str, ...], stdin: bytes, files: dict[str, bytes]) -> tuple[int, bytes, bytes]:
        raise cwa.SandboxNotRunningError("the agent died", infrastructure=infrastructure)

    async with cwa.Session(backend=FakeBackend(exec_handler=dies)) as session, session.sandbox() as sb:
        for _ in range(2):  # the exec that killed it, then a later one refused by the handle
            with pytest.raises(cwa.SandboxNotRunningError) as info:
                await sb.exec(["x"])
            assert info.value.infrastructure is infrastructure
        assert sb.status is cwa.SandboxStatus.FAILED


async def test_iterating_outcomes_after_the_block_is_the_callers_mistake() -> None:
    async def one() -> int:
        return 1

    async with cwa.as_completed([one]) as results:
        pass
    with pytest.raises(cwa.SandboxError, match="outcome stream is closed") as info:
        async for _ in results:
            pass
    assert not info.value.infrastructure


def test_a_create_that_failed_with_a_bug_is_not_counted_as_infrastructure() -> None:
    from cwsandbox_async.metrics._aggregator import MetricsAggregator

    metrics = MetricsAggregator()
    metrics.sandbox_create_failed(KeyError("a backend bug"))
    metrics.sandbox_create_failed(cwa.SandboxCreationError("image pull failed"))
    snap = metrics.snapshot()
    assert snap.create_failures == 2 and snap.create_infra_failures == 1


async def test_a_tool_on_a_stopped_sandbox_raises_instead_of_blaming_the_model() -> None:
    async with cwa.Session(backend=FakeBackend()) as session:
        sb = await session.sandbox()
        await sb.stop()
        with pytest.raises(cwa.SandboxTerminatedError):
            await run_tool(sb, {"name": "bash", "arguments": '{"command": "true"}'})


def test_starved_and_oom_counts_survive_a_failed_delivery() -> None:
    from cwsandbox_async.metrics._aggregator import MetricsAggregator

    metrics = MetricsAggregator()
    metrics.exec_finished("s", cwa.ExecOutcome.FAILURE, 2.0, 0.1, timed_out=True, infrastructure=True, starved=True)
    metrics.exec_finished("s", cwa.ExecOutcome.COMPLETED_NONZERO, 0.5, 0.4, oom_killed=True)
    _, old = metrics.take(reset=True)
    assert old is not None
    metrics.restore(old)  # the reporter failed: the window comes back
    snap = metrics.snapshot()
    assert (snap.exec_starved, snap.exec_oom_killed, snap.exec_timeouts, snap.exec_infra_failures) == (1, 1, 1, 1)


async def test_a_pool_that_cannot_create_blames_whoever_its_last_error_blames() -> None:
    """Bad credentials make every create fail: the lease fails as the caller's problem, not as infrastructure."""

    class BadCredentials(FakeBackend):
        async def create(self, spec: Any) -> None:
            raise cwa.SandboxBackendUnavailableError("credentials rejected (401)", infrastructure=False)

    options = {"create_attempts": 2, "max_consecutive_failures": 2, "create_backoff_seconds": 0.01}
    async with cwa.Session(backend=BadCredentials()) as s, cwa.SandboxPool(s, size=1, **options) as pool:  # type: ignore[arg-type]
        with pytest.raises(cwa.SandboxBackendUnavailableError, match="credentials rejected") as info:
            async with pool.lease(timeout_seconds=HANG_GUARD_SECONDS):
                pass
    # a caller's mistake is not retried: the lease gets the error itself, in its own words, at once
    assert not info.value.infrastructure and "in a row" not in str(info.value)


def test_a_backend_that_cannot_be_imported_is_the_callers_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from cwsandbox_async import backends

    monkeypatch.setitem(backends.BACKENDS, "missing", "cwsandbox_async_no_such_module:Backend")
    with pytest.raises(cwa.SandboxBackendUnavailableError, match="cannot be imported") as info:
        backends.load_backend("missing")
    assert not info.value.infrastructure


def test_kubernetes_file_size_mismatch_with_a_status_is_the_files_change_not_the_transport() -> None:
    """The exec's status came back (the stream was whole), so fewer bytes mean the file changed meanwhile."""
    from cwsandbox_async.backends.kubernetes._files import read_result, write_result

    with pytest.raises(cwa.SandboxFileError, match="shrank") as read:
        read_result("sb", "/w/f", 100, 0, b"12345", b"10\n", False)
    with pytest.raises(cwa.SandboxFileError, match="changed") as write:
        write_result("sb", "/w/f", 5, 0, b"3\n", b"")
    assert not read.value.infrastructure and not write.value.infrastructure
    assert read_result("sb", "/w/f", 100, 0, b"12345", b"5\n", False) == b"12345"
