"""ART-style tools (errors become observations), ``sandbox_rollout`` (own deadline, always released)
and the ART glue that needs no ART."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from typing import Any

import anyio
import pytest
from guards import HANG_GUARD_SECONDS

from cwsandbox_async import SandboxError, SandboxPool, SandboxValidationError, Session
from cwsandbox_async.integrations.art import (
    ALL_TOOLS,
    RolloutTimeoutError,
    ToolCall,
    execute_tool,
    run_tool,
    sandbox_rollout,
    to_responses_format,
    tool_message,
)
from cwsandbox_async.testing import Faults

from .conftest import backend_for, fake

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
        unparsed = await run_tool(sb, call("submit_solution", code="def f()\n    return 1"), tests="assert f() == 1")
        assert unparsed.submitted and unparsed.passed is False and unparsed.verdict is not None
        assert (unparsed.verdict.kind, unparsed.verdict.reason) == (
            "compile_error",
            "SyntaxError at solution.py line 1: expected ':': def f()",
        )
        assert unparsed.observation.startswith("Tests failed. Compile error: SyntaxError at solution.py line 1")
        with pytest.raises(SandboxValidationError, match="the tests do not compile"):
            await run_tool(sb, call("submit_solution", code="def f(): return 1"), tests="assert f() ==")
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

        assert await sandbox_rollout(pool, ok, timeout_seconds=HANG_GUARD_SECONDS) == "hi"

        async def boom(sb: Any) -> None:
            raise KeyError("mine")

        with pytest.raises(KeyError):
            await sandbox_rollout(pool, boom, timeout_seconds=HANG_GUARD_SECONDS)

        async def forever(sb: Any) -> None:
            await anyio.sleep_forever()

        with anyio.fail_after(HANG_GUARD_SECONDS), pytest.raises(RolloutTimeoutError) as info:
            await sandbox_rollout(pool, forever, timeout_seconds=0.2)
        assert not info.value.infrastructure

        with anyio.move_on_after(0.2):  # an outer cancellation still releases
            await sandbox_rollout(pool, forever, timeout_seconds=60)

        with anyio.move_on_after(HANG_GUARD_SECONDS):  # the cancelled lease's release runs shielded, in the background
            while pool.statistics().leased or pool.statistics().destroying:  # noqa: ASYNC110 - the pool's own state
                await anyio.sleep(0.01)
        assert pool.statistics().leased == 0
        # a Session works as a source too (a new sandbox, stopped afterwards)
        before = backend.created
        assert await sandbox_rollout(session, ok, timeout_seconds=HANG_GUARD_SECONDS) == "hi"
        assert backend.created == before + 1
        with pytest.raises(SandboxValidationError):
            await sandbox_rollout(object(), ok, timeout_seconds=1)
        with pytest.raises(SandboxValidationError):
            await sandbox_rollout(pool, ok, timeout_seconds=-1)
    assert backend.live == 0


# -- ART glue without ART --------------------------------------------------------------


def test_integrations_import_no_trainer_packages() -> None:
    code = (
        "import sys\n"
        "import cwsandbox_async.integrations.art, cwsandbox_async.integrations.trl\n"
        "heavy = {'art', 'trl', 'torch', 'transformers', 'datasets', 'openai', 'wandb'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=HANG_GUARD_SECONDS)


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
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=HANG_GUARD_SECONDS
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    sync_file = next(line.split(" ", 1)[1] for line in proc.stdout.splitlines() if line.startswith("SYNC "))
    from wandb_reader import read_history  # imports wandb's protobufs

    rows = read_history(sync_file)
    assert [r["cwsandbox/step"] for r in rows] == [3, 4]
    assert all(r["cwsandbox/executions"] == 1 for r in rows)
