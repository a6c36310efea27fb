"""Why each completion scored what it did: ``code_reward``'s verdicts, and starved runs retried.

The batch of issue 25 (correct, wrong, an infinite loop, one that prints then ``os._exit(0)``,
one that allocates 2 GiB, one with no code) scored on the local backend: each item's kind,
reason, score and facts; the printed line counts them; DEBUG logs name each index. Then the
same kind of batch with the machine overloaded by other sandboxes' busy programs: the infinite
loop is retried and ends as a timeout (0.0), the correct but slow program passes.
"""

from __future__ import annotations

import json
import os
from contextlib import AsyncExitStack
from pathlib import Path

import anyio
import pytest
from structlog.contextvars import merge_contextvars
from structlog.testing import capture_logs

from cwsandbox_async import SandboxValidationError, Session
from cwsandbox_async.integrations.trl import CompletionVerdict, VerdictKind, code_reward

from .conftest import fake

RIGHT = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return a - b\n"
TESTS = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n"
LOOP = "def add(a, b):\n    while True:\n        pass\n"

BATCH = {
    "correct": RIGHT,
    "wrong": WRONG,
    "infinite loop": LOOP,
    "prints then exits 0": "import os\nprint(5)\nprint(0)\nos._exit(0)\n" + WRONG,
    "allocates 2 GiB": "x = b'x' * (2 << 30)\n" + RIGHT,
    "no code": None,
}


def answer(code: str | None) -> str:
    return "I do not know how to do that." if code is None else f"<answer>\n{code}</answer>"


async def test_every_completion_gets_its_verdict(local_only: None) -> None:
    seen: list[list[CompletionVerdict]] = []
    reward = code_reward(
        name="unit_tests",
        tests_column="tests",
        pool_size=0,
        timeout_seconds=3,
        defaults={"resources": {"memory_mib": 256}},
        on_verdicts=seen.append,
    )
    try:
        with capture_logs([merge_contextvars]) as logs, anyio.fail_after(180):
            rewards = await reward(completions=[answer(c) for c in BATCH.values()], tests=[TESTS] * len(BATCH))
    finally:
        await reward.aclose()
    verdicts = dict(zip(BATCH, reward.last_verdicts, strict=True))
    # the loop is `timeout` once it got its 3 s of CPU (at once, or on its retry); on a machine so busy
    # that even the retry (12 s of wall time) cannot give it them, it is left unscored as `starved`
    starved = verdicts["infinite loop"].kind is VerdictKind.STARVED
    assert rewards == [1.0, 0.0, None if starved else 0.0, 0.0, 0.0, None]
    assert seen == [reward.last_verdicts]
    assert [v.index for v in reward.last_verdicts] == list(range(len(BATCH)))
    assert [v.score for v in reward.last_verdicts] == rewards

    def check(name: str, kind: VerdictKind, reason: str) -> CompletionVerdict:
        v = verdicts[name]
        assert v.kind is kind and reason in v.reason, (name, v)
        return v

    v = check("correct", VerdictKind.PASSED, "its tests passed")
    assert v.exit_code == 0 and v.wall_seconds is not None and v.cpu_seconds is not None
    v = check("wrong", VerdictKind.WRONG_ANSWER, "AssertionError at tests.py line 1: assert add(2, 3) == 5")
    assert v.exit_code == 1 and "AssertionError" in v.stderr_tail
    v = verdicts["infinite loop"]
    if starved:
        assert v.score is None and v.retries >= 1 and "starved of CPU" in v.reason, v
    else:
        assert v.kind is VerdictKind.TIMEOUT and v.score == 0.0, v
        # its own timeout; or, starved on a busy machine, its CPU time used up on the retry
        assert "ran past its timeout of 3 s" in v.reason or "used its 3 s of CPU time on a retry" in v.reason, v
    assert v.wall_seconds is not None and v.wall_seconds >= 3
    check("prints then exits 0", VerdictKind.EARLY_EXIT, "the program ended its process (exit status 0) before")
    v = check("allocates 2 GiB", VerdictKind.OOM, "killed for its memory")
    assert v.exit_code is not None and v.exit_code != 0
    v = check("no code", VerdictKind.NO_CODE, "holds no code")
    assert v.score is None and v.exit_code is None and v.wall_seconds is None

    stats = reward.last_stats
    assert stats is not None and stats.count(VerdictKind.TIMEOUT) == (0 if starved else 1)
    line = stats.line()
    assert line.startswith("[CWSandbox] Reward call 1 (unit_tests): 5 sandboxes, 1/5 passed, 1 skipped (no code)")
    for part in ("1 wrong", "1 early exits", "1 out of memory", "1 starved of CPU" if starved else "1 timed out"):
        assert part in line, line
    logged = [e for e in logs if e["event"] == "reward verdict"]
    assert sorted(e["index"] for e in logged) == list(range(len(BATCH)))
    assert {e["index"]: e["kind"] for e in logged} == {v.index: str(v.kind) for v in reward.last_verdicts}
    assert all(e["log_level"] == "debug" for e in logged)
    timed_out = [e for e in logs if e["event"] == "exec timed out"]  # the sandbox layer's own line
    # each bound to its completion; the loop's among them; another completion's only when it was starved
    # (a busy machine) and then passed on its retry (its reward is asserted above)
    assert any(e.get("completion") == 2 for e in timed_out), timed_out
    assert all(e.get("completion") == 2 or (e.get("completion") is not None and e["starved"]) for e in timed_out)


async def test_verdicts_on_the_fake_backend_and_a_bad_callback_setting() -> None:
    reward = code_reward(tests_column="tests", pool_size=0, verbose=False, backend=fake())
    try:
        rewards = await reward(completions=[answer(RIGHT), answer(None)], tests=[TESTS] * 2)
    finally:
        await reward.aclose()
    assert rewards == [1.0, None]
    assert [v.kind for v in reward.last_verdicts] == [VerdictKind.PASSED, VerdictKind.NO_CODE]
    for bad in ({"on_verdicts": 3}, {"starved_retries": -1}, {"harness": "nope"}, {"verdict_table": True}):
        with pytest.raises(SandboxValidationError):
            code_reward(**bad)


async def test_code_fenced_as_another_language_scores_zero_not_none() -> None:
    """A wrong answer must not escape its 0.0 by fencing itself as a language the reward does not run."""
    reward = code_reward(tests_column="tests", pool_size=0, verbose=False, backend=fake())
    cpp = "```cpp\nint main() { return 0; }\n```"
    prose = "No code here, only ```inline``` words."
    try:
        rewards = await reward(completions=[cpp, prose, "```\n" + RIGHT + "```"], tests=[TESTS] * 3)
    finally:
        await reward.aclose()
    assert rewards == [0.0, None, 1.0]
    first = reward.last_verdicts[0]
    assert first.kind is VerdictKind.COMPILE_ERROR and "fenced as 'cpp'" in first.reason, first
    assert reward.last_verdicts[1].kind is VerdictKind.NO_CODE


BUSY = "while True:\n    pass\n"
#: Correct, and needs about 1 s of CPU: more than its 2 s timeout allows with a seventh of a core.
SLOW = "import time\nend = time.process_time() + 1.0\nwhile time.process_time() < end:\n    pass\n" + RIGHT


async def test_under_overload_a_starved_loop_is_retried_to_zero_and_a_slow_correct_program_passes(
    local_only: None,
) -> None:
    n = 6 * (os.cpu_count() or 2)  # other sandboxes' busy programs: about a seventh of a core each
    async with Session(backend="local") as session, AsyncExitStack() as busy:
        for _ in range(n):
            sb = await busy.enter_async_context(session.sandbox())
            await busy.enter_async_context(sb.process(["python3", "-c", BUSY], timeout_seconds=600))
        await anyio.sleep(1.0)
        reward = code_reward(
            tests_column="tests",
            pool_size=0,
            timeout_seconds=2,
            starved_retry_timeout_seconds=240,
            verbose=False,
        )
        try:
            with anyio.fail_after(400):
                rewards = await reward(completions=[answer(LOOP), answer(SLOW)], tests=[TESTS] * 2)
        finally:
            await reward.aclose()
    loop, slow = reward.last_verdicts
    assert rewards == [0.0, 1.0], (loop, slow)
    assert loop.kind is VerdictKind.TIMEOUT and loop.retries == 1, loop
    assert "used its 2 s of CPU time on a retry" in loop.reason
    assert loop.cpu_seconds is not None and loop.cpu_seconds >= 2.0
    assert slow.kind is VerdictKind.PASSED and slow.retries == 1, slow
    stats = reward.last_stats
    assert stats is not None and (stats.starved_retried, stats.starved, stats.infra_failures) == (2, 0, 0)
    assert "2 retried after starving" in stats.line()


async def test_the_worst_verdicts_go_to_wandb_as_a_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``verdict_table=N``: the N worst verdicts of each call, in a real offline W&B run, read back."""
    wandb = pytest.importorskip("wandb")
    from wandb_reader import read_history

    for key in [k for k in os.environ if k.startswith("WANDB")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = wandb.init(project="cwsandbox-async-test", dir=str(tmp_path), reinit="create_new")
    codes = [RIGHT, WRONG, "import os\nos._exit(0)\n", None, "def add(a, b)\n"]
    reward = code_reward(tests_column="tests", pool_size=0, verbose=False, backend=fake(), run=run, verdict_table=2)
    off = code_reward(tests_column="tests", pool_size=0, verbose=False, backend=fake(), run=run)  # the default: off
    try:
        for r in (reward, off):
            await r(completions=[answer(c) for c in codes], tests=[TESTS] * len(codes))
    finally:
        await reward.aclose()
        await off.aclose()
    run.finish()
    key = "cwsandbox/sandbox_reward/worst_verdicts"  # W&B flattens the table's reference under its key
    rows = [row for row in read_history(run.settings.sync_file) if f"{key}/_type" in row]
    assert len(rows) == 1, rows  # one call with the table on, none from the one with it off
    assert rows[0][f"{key}/_type"] == "table-file" and rows[0][f"{key}/nrows"] == 2
    table = json.loads((Path(run.dir) / rows[0][f"{key}/path"]).read_text())
    assert table["columns"][:3] == ["index", "kind", "score"]
    # worst first: the early exit, then the compile error (the wrong answer, the pass and the no-code item
    # are not the worst two)
    assert [r[:3] for r in table["data"]] == [[2, "early_exit", 0.0], [4, "compile_error", 0.0]]


def test_every_kind_has_its_place_in_the_worst_first_order() -> None:
    """``VerdictKind.rank`` is total (mypy rejects a kind its ``match`` leaves out): no kind breaks the table."""
    from cwsandbox_async.integrations._verdict_table import worst

    assert sorted(k.rank for k in VerdictKind) == list(range(len(VerdictKind)))
    verdicts = [CompletionVerdict(i, kind, 0.0 if kind.scored else None) for i, kind in enumerate(VerdictKind)]
    ranked = [v.kind for v in worst(list(reversed(verdicts)), len(verdicts))]
    assert ranked == [k for k in sorted(VerdictKind, key=lambda k: k.rank) if k is not VerdictKind.PASSED]
    assert ranked[:2] == [VerdictKind.INFRASTRUCTURE, VerdictKind.STARVED]  # what was not scored comes first
    assert ranked[-3:] == [VerdictKind.WRONG_ANSWER, VerdictKind.PARTIAL, VerdictKind.NO_CODE]
