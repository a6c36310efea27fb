"""The TRL reward functions: async, on a TRL-style loop thread, and the sync bridge.

Needs no trainer package: TRL's call conventions are reproduced with plain
asyncio threads and duck-typed objects.
"""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import sys
import threading
import uuid
from dataclasses import dataclass
from typing import Any

import anyio
import pytest
from guards import HANG_GUARD_SECONDS

from cwsandbox_async import SandboxError, SandboxValidationError
from cwsandbox_async.integrations.trl import code_reward, code_reward_sync
from cwsandbox_async.testing import Faults

from .conftest import backend_for, fake, leftovers

COMPLETIONS = [
    "<answer>print('hi')</answer>",  # passes
    "I have no idea.",  # no code
    "```python\nraise SystemExit(3)\n```",  # fails
    [{"role": "assistant", "content": "<answer>\n    def double(x):\n        return 2 * x\n</answer>"}],
]
TESTS = [None, None, None, "assert double(21) == 42"]


# -- TRL reward: async ---------------------------------------------------------------


@dataclass
class TrainerState:
    global_step: int


class RecordingReporter:
    """A real Reporter (the protocol Session uses) that keeps what it was given."""

    name = "recording"

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.executions: list[int] = []

    def available(self) -> bool:
        return True

    def report(self, snapshot: Any, step: int) -> None:
        self.steps.append(step)
        self.executions.append(snapshot.executions)


async def test_async_reward_scores_logs_and_closes(backend_name: str, capsys: pytest.CaptureFixture[str]) -> None:
    backend = backend_for(backend_name)
    tag = f"test:{uuid.uuid4().hex[:8]}"
    reporter = RecordingReporter()
    reward = code_reward(
        name="sandbox_tests",
        tests_column="tests",
        pool_size=2,
        backend=backend,
        defaults={"tags": (tag,)},
        report_to=[reporter],  # type: ignore[list-item]
    )
    assert reward.__name__ == "sandbox_tests"
    metrics: dict[str, list[float]] = {}
    try:
        for step in (0, 0, 1):
            rewards = await reward(
                prompts=["p"] * 4,
                completions=COMPLETIONS,
                tests=TESTS,
                trainer_state=TrainerState(step),
                log_metric=lambda k, v: metrics.setdefault(k, []).append(v),
            )
            assert rewards == [1.0, None, 0.0, 1.0]
        session = reward.handle._host.session if reward.handle._host else None
        assert session is not None and session.state.value == "open"
    finally:
        await reward.aclose()
    out = capsys.readouterr().out
    for n in (1, 2, 3):
        assert f"[CWSandbox] Reward call {n} (sandbox_tests): 3 sandboxes, 2/3 passed, 1 skipped (no code)" in out
    assert reward.calls == 3 and reward.last_stats is not None and reward.last_stats.step == 1
    assert metrics["cwsandbox/sandbox_tests/pass_rate"] == pytest.approx([2 / 3] * 3)
    assert metrics["cwsandbox/sandbox_tests/no_code_fraction"] == [0.25] * 3
    # one flush per training step (the second call at step 0 folds into the next), the rest at close
    assert reporter.steps[:2] == [1, 2]  # global_step 0 is step 1's rewards (TRL logs them at train/global_step 1)
    assert sum(reporter.executions) >= 9
    assert await leftovers(backend_name, backend, tag) == 0
    await reward.aclose()  # idempotent


async def test_async_reward_program_timeout_is_zero_and_infra_failure_is_none(
    capsys: pytest.CaptureFixture[str],
) -> None:
    slow = code_reward(timeout_seconds=0.5, pool_size=0, backend=fake())
    broken_backend = fake(faults=Faults(exec_transport_error=1.0))
    broken = code_reward(pool_size=0, backend=broken_backend)
    try:
        with anyio.fail_after(HANG_GUARD_SECONDS):
            assert await slow(completions=["<answer>import time; time.sleep(30)</answer>"]) == [0.0]
            assert await broken(completions=["<answer>print(1)</answer>", "nothing"]) == [None, None]
    finally:
        await slow.aclose()
        await broken.aclose()
    out = capsys.readouterr().out
    assert "1 sandboxes, 0/1 passed, 0 skipped (no code)" in out
    assert "1 sandboxes, 0/1 passed, 1 skipped (no code), 1 infra failures (not scored)" in out
    assert broken_backend.live == 0


async def test_async_reward_is_bound_to_its_first_loop() -> None:
    backend = fake()
    reward = code_reward(pool_size=0, verbose=False, backend=backend)
    assert await reward(completions=["<answer>pass</answer>"]) == [1.0]

    def other_loop() -> None:
        async def call() -> None:
            with pytest.raises(SandboxError, match="bound to the event loop") as info:
                await reward(completions=["<answer>pass</answer>"])
            assert not info.value.infrastructure  # the caller's mistake

        asyncio.run(call())

    await anyio.to_thread.run_sync(other_loop)
    with pytest.raises(SandboxError, match="would block the loop") as info:
        reward.close()  # from its own loop
    assert not info.value.infrastructure
    await reward.aclose()
    assert backend.live == 0


def test_async_reward_on_a_trl_style_loop_thread() -> None:
    """TRL: one daemon-thread loop for the run; each batch via run_coroutine_threadsafe(...).result()."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    backend = fake()
    reward = code_reward(pool_size=2, verbose=False, backend=backend)
    try:
        sessions = []
        for step in range(3):
            fut = asyncio.run_coroutine_threadsafe(
                reward(prompts=["p"] * 2, completions=COMPLETIONS[:2], trainer_state=TrainerState(step)), loop
            )
            assert fut.result(timeout=30) == [1.0, None]
            assert reward.handle._host is not None
            sessions.append(reward.handle._host.session)
        assert sessions[0] is sessions[1] is sessions[2]  # kept across calls, not one per call
        assert backend.live >= 1  # the pool keeps sandboxes warm between steps
        reward.close()  # from the main thread, as atexit would
        assert backend.live == 0
        assert not [t for t in asyncio.all_tasks(loop) if not t.done()]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


# -- TRL reward: sync bridge ---------------------------------------------------------


def test_sync_reward_runs_on_one_persistent_loop(backend_name: str, capsys: pytest.CaptureFixture[str]) -> None:
    backend = backend_for(backend_name)
    tag = f"test:{uuid.uuid4().hex[:8]}"
    reward = code_reward_sync(tests_column="tests", pool_size=2, backend=backend, defaults={"tags": (tag,)})

    def loop_threads() -> int:
        return sum(1 for t in threading.enumerate() if t.name == "cwsandbox-sandbox_reward")

    assert loop_threads() == 0
    try:
        assert reward(prompts=["p"] * 4, completions=COMPLETIONS, tests=TESTS) == [1.0, None, 0.0, 1.0]
        bridge = reward._bridge
        assert bridge is not None
        session = bridge.host.session
        results: list[list[float | None]] = []

        def worker() -> None:
            results.append(reward(completions=COMPLETIONS, tests=TESTS))

        workers = [threading.Thread(target=worker) for _ in range(3)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(60)
        assert results == [[1.0, None, 0.0, 1.0]] * 3
        assert reward._bridge is bridge and bridge.host.session is session  # same loop, same session
        assert loop_threads() == 1  # one persistent loop thread, not one per call
    finally:
        reward.close()
    reward.close()  # idempotent
    assert bridge.closed and bridge.host.session is None
    out = capsys.readouterr().out
    for n in (1, 2, 3, 4):
        assert f"[CWSandbox] Reward call {n} (sandbox_reward): 3 sandboxes, 2/3 passed, 1 skipped (no code)" in out
    assert anyio.run(leftovers, backend_name, backend, tag) == 0
    assert loop_threads() == 0  # close() joined it


def test_sync_reward_closes_at_interpreter_exit() -> None:
    """No close() call: the atexit hook stops the sandboxes and the process exits promptly."""
    code = (
        "import atexit\n"
        "from cwsandbox_async.integrations.trl import code_reward_sync\n"
        "from cwsandbox_async.testing import FakeBackend\n"
        "b = FakeBackend()\n"
        "atexit.register(lambda: print('live at exit', b.live, 'created', b.created))\n"  # LIFO: runs last
        "r = code_reward_sync(pool_size=3, backend=b, verbose=False, extractor=lambda t: 'true')\n"
        "r._core.python = 'true'\n"
        "print(r(completions=['x']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "[0.0]" in proc.stdout  # `true` exits 0 without running the harness: not a pass
    assert "live at exit 0 created" in proc.stdout


def test_async_reward_is_a_coroutine_function_for_every_trl() -> None:
    """TRL < 1.14 awaits a reward only if ``inspect.iscoroutinefunction(f)``; TRL >= 1.14 also looks at __call__."""
    reward = code_reward(name="unit_tests", pool_size=0, backend=fake())
    assert inspect.iscoroutinefunction(reward)  # what TRL 1.0-1.13 checks
    assert reward.__name__ == "unit_tests"  # what TRL names rewards/<name>/mean after
    sync = code_reward_sync(pool_size=0, backend=fake())
    assert not inspect.iscoroutinefunction(sync) and not inspect.iscoroutinefunction(sync.__call__)


def test_reward_rejects_bad_settings_early() -> None:
    with pytest.raises(SandboxValidationError):
        code_reward(name="not an identifier")
    with pytest.raises(SandboxValidationError):
        code_reward(pool_size=-1)
    with pytest.raises(SandboxValidationError):
        code_reward_sync(limit=0)
    with pytest.raises(SandboxValidationError):
        code_reward(timeout_seconds=0)
    with pytest.raises(SandboxValidationError):
        code_reward(backend="nope")


async def test_reward_rejects_bad_calls() -> None:
    reward = code_reward(tests_column="tests", pool_size=0, backend=fake(), verbose=False)
    try:
        with pytest.raises(SandboxValidationError, match="not among the reward kwargs"):
            await reward(completions=["<answer>x</answer>"], other=[1])
        with pytest.raises(SandboxValidationError, match="one entry per completion"):
            await reward(completions=["<answer>x</answer>"], tests=["a", "b"])
        with pytest.raises(SandboxValidationError):
            await reward(completions="<answer>x</answer>", tests=["a"])
    finally:
        await reward.aclose()
