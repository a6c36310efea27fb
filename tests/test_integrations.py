"""Integrations: code extraction, the TRL reward functions (async, TRL-style loop thread, sync bridge),
ART-style tools (errors become observations) and ``sandbox_rollout`` (own deadline, always released).

Needs no trainer package: TRL's and ART's call conventions are reproduced with
plain asyncio threads and duck-typed objects. Programs really run: on the local
backend in bwrap sandboxes, and on the FakeBackend through a handler that runs
the command as a host subprocess (only the programs written in this file).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
import threading
import uuid
from dataclasses import dataclass
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
from cwsandbox_async.integrations._extract import completion_text, extract_code
from cwsandbox_async.integrations.art import (
    ALL_TOOLS,
    RolloutTimeoutError,
    ToolCall,
    execute_tool,
    run_tool,
    sandbox_rollout,
    to_responses_format,
    tool_message,
    wandb_run,
)
from cwsandbox_async.integrations.trl import code_reward, code_reward_sync
from cwsandbox_async.testing import FakeBackend, Faults

# -- backends ----------------------------------------------------------------------


async def run_on_host(argv: tuple[str, ...], stdin: bytes, files: dict[str, bytes]) -> tuple[int, bytes, bytes]:
    result = await anyio.run_process(list(argv), check=False, input=stdin or None)
    return result.returncode, result.stdout, result.stderr


def fake(**kw: Any) -> FakeBackend:
    return FakeBackend(exec_handler=run_on_host, **kw)


async def _local_works() -> str | None:
    try:
        async with Session(backend="local") as s, s.sandbox():
            return None
    except SandboxBackendUnavailableError as exc:
        return str(exc)


@pytest.fixture(params=["fake", "local"])
def backend_name(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    if name == "local":
        problem = anyio.run(_local_works)
        if problem is not None:
            pytest.skip(f"local backend not available: {problem}")
    return name


def backend_for(name: str) -> FakeBackend | str:
    return fake() if name == "fake" else name


async def leftovers(name: str, backend: FakeBackend | str, tag: str) -> int:
    """Sandboxes still alive after everything closed: the fake's count, or a fresh local session's list."""
    if isinstance(backend, FakeBackend):
        return backend.live
    async with Session(backend=name) as s:
        return len(await s.list([tag]))


COMPLETIONS = [
    "<answer>print('hi')</answer>",  # passes
    "I have no idea.",  # no code
    "```python\nraise SystemExit(3)\n```",  # fails
    [{"role": "assistant", "content": "<answer>\n    def double(x):\n        return 2 * x\n</answer>"}],
]
TESTS = [None, None, None, "assert double(21) == 42"]


# -- extraction --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("<answer>x = 1</answer>", "x = 1"),
        ("a <answer>x = 1</answer> b <answer>y = 2</answer>", "y = 2"),
        ("<ANSWER>\n  x = 1\n  y = 2\n</ANSWER>", "x = 1\ny = 2"),
        ("<answer>```python\nx = 1\n```</answer>", "x = 1"),
        ("<answer>x = 1", "x = 1"),  # unclosed last tag runs to the end
        ("text\n```python\nx = 1\n```\nmore\n```py\ny = 2\n```", "y = 2"),
        ("```\nz = 3\n```", "z = 3"),
        ("no code at all", None),
        ("<answer>   \n </answer>", None),
        ("", None),
    ],
)
def test_extract_code(text: str, code: str | None) -> None:
    assert extract_code(text) == code


def test_completion_text_forms() -> None:
    assert completion_text("plain") == "plain"
    assert completion_text([{"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]) == "a\nb"
    assert completion_text([{"role": "user", "content": "u"}]) == "u"
    parts = [{"role": "assistant", "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}]}]
    assert completion_text(parts) == "xy"
    assert completion_text({"role": "assistant", "content": None}) == ""
    assert completion_text(None) == ""


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
        session = reward._host.session if reward._host else None
        assert session is not None and session.state.value == "open"
    finally:
        await reward.aclose()
    out = capsys.readouterr().out
    for n in (1, 2, 3):
        assert f"[CWSandbox] Reward call {n}: 3 sandboxes, 2/3 passed, 1 skipped (no code)" in out
    assert reward.calls == 3 and reward.last_stats is not None and reward.last_stats.step == 1
    assert metrics["cwsandbox/reward/pass_rate"] == pytest.approx([2 / 3] * 3)
    assert metrics["cwsandbox/reward/no_code_fraction"] == [0.25] * 3
    # one flush per training step (the second call at step 0 folds into the next), the rest at close
    assert reporter.steps[:2] == [0, 1]
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
        with anyio.fail_after(20):
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
            with pytest.raises(SandboxError, match="bound to the event loop"):
                await reward(completions=["<answer>pass</answer>"])

        asyncio.run(call())

    await anyio.to_thread.run_sync(other_loop)
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
            assert reward._host is not None
            sessions.append(reward._host.session)
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
        assert f"[CWSandbox] Reward call {n}: 3 sandboxes, 2/3 passed, 1 skipped (no code)" in out
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
    assert "[1.0]" in proc.stdout
    assert "live at exit 0 created" in proc.stdout


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


# -- tools ---------------------------------------------------------------------------


def call(name: str, **args: Any) -> dict[str, Any]:
    return {"id": "c1", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


async def test_tools_turn_mistakes_into_observations(backend_name: str) -> None:
    backend = backend_for(backend_name)
    async with Session(backend=backend) as session, session.sandbox() as sb:
        ok = await run_tool(sb, call("execute_code", code="print(6 * 7)"))
        assert ok.ok and ok.observation == "42"
        err = await run_tool(sb, call("execute_code", code="raise ValueError('boom')"))
        assert (
            not err.ok and err.observation.startswith("Error (exit code 1):") and "ValueError: boom" in err.observation
        )
        slow = await run_tool(sb, call("execute_code", code="import time; time.sleep(30)"), timeout_seconds=1)
        assert slow.timed_out and slow.observation.startswith("Error: command timed out after 1 seconds")
        assert (await execute_tool(sb, {"name": "execute_code", "arguments": "{not json"})).startswith(
            "Error: invalid JSON arguments"
        )
        assert "unknown tool 'rm_rf'" in await execute_tool(sb, call("rm_rf"))
        assert "missing required string argument 'code'" in await execute_tool(sb, call("execute_code"))
        assert "must be a JSON object" in await execute_tool(sb, {"name": "bash", "arguments": "[1]"})
        missing = await run_tool(sb, call("read_file", path="nope/missing.txt"))
        assert not missing.ok and missing.observation.startswith("Error: read_file failed")
        wrote = await run_tool(sb, call("write_file", path="notes/a.txt", content="héllo"))
        assert wrote.ok and wrote.observation == "Wrote 6 bytes to /workspace/notes/a.txt"
        assert await execute_tool(sb, call("read_file", path="/workspace/notes/a.txt")) == "héllo"
        bad_path = await run_tool(sb, call("write_file", path="/work\x00space", content="x"))
        assert not bad_path.ok and bad_path.observation.startswith("Error: write_file failed")
        passed = await run_tool(sb, call("submit_solution", code="def f(): return 1"), tests="assert f() == 1")
        assert passed.submitted and passed.passed and passed.observation == "All tests passed."
        failed = await run_tool(sb, call("submit_solution", code="def f(): return 2"), tests="assert f() == 1")
        assert failed.submitted and failed.passed is False and failed.observation.startswith("Tests failed.")
        no_tests = await run_tool(sb, call("submit_solution", code="x = 1"))
        assert no_tests.submitted and no_tests.passed is None and "no tests" in no_tests.observation
        surrogate = await run_tool(sb, call("execute_code", code="print(1)\ud800"))
        assert not surrogate.ok and surrogate.observation.startswith("Error (exit code 1):")
        if backend_name == "local":  # the fake's files are not visible to the host programs it runs
            big = await run_tool(sb, call("execute_code", code="# " + "x" * 150_000 + "\nprint('big')"))
            assert big.ok and big.observation == "big"  # past the argv limit: written to a file, then run
            bash = await run_tool(sb, call("bash", command="cat notes/a.txt; echo oops >&2; exit 3"))
            assert not bash.ok and bash.observation == "Error (exit code 3):\nhéllo\noops"


async def test_tools_raise_for_platform_failures() -> None:
    async with Session(backend=fake(faults=Faults(exec_transport_error=1.0))) as session, session.sandbox() as sb:
        with pytest.raises(SandboxError) as info:
            await run_tool(sb, ToolCall("execute_code", {"code": "print(1)"}))
        assert info.value.infrastructure


def test_tool_schemas_and_messages() -> None:
    names = [t["function"]["name"] for t in ALL_TOOLS]
    assert names == ["execute_code", "submit_solution", "bash", "read_file", "write_file"]
    flat = to_responses_format(ALL_TOOLS)
    assert all(t["strict"] and t["parameters"]["additionalProperties"] is False for t in flat)
    assert tool_message(call("bash", command="ls"), "out") == {"role": "tool", "tool_call_id": "c1", "content": "out"}

    class Fn:
        name = "bash"
        arguments = '{"command": "ls"}'

    class ChatCall:  # the shape of openai's ChatCompletionMessageToolCall
        id = "x9"
        function = Fn()

    assert tool_message(ChatCall(), "o")["tool_call_id"] == "x9"


# -- sandbox_rollout -----------------------------------------------------------------


async def test_rollout_releases_on_return_error_deadline_and_cancel() -> None:
    backend = fake()
    async with Session(backend=backend) as session, SandboxPool(session, size=1, max_size=2) as pool:

        async def ok(sb: Any) -> str:
            return str((await sb.exec(["python3", "-c", "print('hi')"])).stdout.strip())

        assert await sandbox_rollout(pool, ok, timeout_seconds=10) == "hi"

        async def boom(sb: Any) -> None:
            raise KeyError("mine")

        with pytest.raises(KeyError):
            await sandbox_rollout(pool, boom, timeout_seconds=10)

        async def forever(sb: Any) -> None:
            await anyio.sleep_forever()

        with anyio.fail_after(10), pytest.raises(RolloutTimeoutError) as info:
            await sandbox_rollout(pool, forever, timeout_seconds=0.2)
        assert not info.value.infrastructure

        with anyio.move_on_after(0.2):  # an outer cancellation still releases
            await sandbox_rollout(pool, forever, timeout_seconds=60)

        for _ in range(1000):  # the cancelled lease's release runs shielded, in the background of the pool
            if not (pool.statistics().leased or pool.statistics().destroying):
                break
            await anyio.sleep(0.01)
        assert pool.statistics().leased == 0
        # a Session works as a source too (a new sandbox, stopped afterwards)
        before = backend.created
        assert await sandbox_rollout(session, ok, timeout_seconds=10) == "hi"
        assert backend.created == before + 1
        with pytest.raises(SandboxValidationError):
            await sandbox_rollout(object(), ok, timeout_seconds=1)
        with pytest.raises(SandboxValidationError):
            await sandbox_rollout(pool, ok, timeout_seconds=-1)
    assert backend.live == 0


# -- ART glue without ART --------------------------------------------------------------


def test_wandb_run_follows_arts_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    run = object()

    class Model:
        def __init__(self, report_metrics: list[str] | None) -> None:
            self.report_metrics = report_metrics

        def _get_wandb_run(self) -> object:
            return run

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    assert wandb_run(Model(None)) is None
    assert wandb_run(Model(["wandb"])) is run
    assert wandb_run(Model([])) is None
    monkeypatch.setenv("WANDB_API_KEY", "x")
    assert wandb_run(Model(None)) is run
    assert wandb_run(object()) is None


def test_integrations_import_no_trainer_packages() -> None:
    code = (
        "import sys\n"
        "import cwsandbox_async.integrations.art, cwsandbox_async.integrations.trl\n"
        "heavy = {'art', 'trl', 'torch', 'transformers', 'datasets', 'openai', 'wandb'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.integration
def test_sandbox_metrics_land_in_arts_wandb_run(tmp_path: Any) -> None:
    """ART creates its run with reinit="create_new" (wandb.run stays None): run= hands it over explicitly."""
    if importlib.util.find_spec("art") is None or importlib.util.find_spec("wandb") is None:
        pytest.skip("needs the art extra (openpipe-art) and wandb")
    code = f"""
import anyio, art, wandb
import cwsandbox_async as cwa
from cwsandbox_async.integrations.art import wandb_run
from cwsandbox_async.testing import FakeBackend
model = art.Model(name="m1", project="p1", base_path={str(tmp_path / ".art")!r})
run = wandb_run(model)
assert run is not None and wandb.run is None, (run, wandb.run)
async def main():
    async with cwa.Session(backend=FakeBackend(), run=run) as s:
        for step in (3, 4):
            async with s.sandbox() as sb:
                await sb.exec(["true"])
            assert s.log_metrics(step=step)
anyio.run(main)
print("SYNC", run.settings.sync_file)
run.finish()
"""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("WANDB")},
        "WANDB_API_KEY": "offline-test-key",
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(tmp_path),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=100
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    sync_file = next(line.split(" ", 1)[1] for line in proc.stdout.splitlines() if line.startswith("SYNC "))
    from wandb_reader import read_history  # imports wandb's protobufs

    rows = read_history(sync_file)
    assert [r["cwsandbox/step"] for r in rows] == [3, 4]
    assert all(r["cwsandbox/executions"] == 1 for r in rows)
