"""The judge on the local backend, Python only (cheap): dataset shapes, comparison modes, scores, checkers,
toolchain checks and metrics. One sandbox for the module; every judgement is a real run in it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

import cwsandbox_async as cwa
from cwsandbox_async.judge import (
    Checker,
    Judge,
    Language,
    Limits,
    TestCase,
    ToolchainError,
    Verdict,
    from_apps,
    from_asserts,
    from_codecontests,
    from_livecodebench,
    register_language,
)

LIMITS = Limits(time_seconds=1.0, memory_mib=128)
ADD = "a, b = map(int, input().split())\nprint(a + b)\n"


@pytest.fixture(scope="module")
async def sb(local_session: cwa.Session) -> AsyncIterator[cwa.Sandbox]:
    async with local_session.sandbox() as sandbox:
        yield sandbox


def verdicts(result: object) -> list[str]:
    return [c.verdict.value for c in result.cases]  # type: ignore[attr-defined]


async def test_codecontests_row_public_private_generated(local_session: cwa.Session, sb: cwa.Sandbox) -> None:
    row = {
        "name": "add",
        "public_tests": {"input": ["1 2\n"], "output": ["3\n"]},
        "private_tests": {"input": ["10 20\n", "-1 1\n"], "output": ["30\n", "0\n"]},
        "generated_tests": {"input": ["5 5\n"], "output": ["10\n"]},
    }
    problem = from_codecontests(row)
    assert [c.name for c in problem.cases] == ["public/0", "private/0", "private/1", "generated/0"]
    judge = Judge(local_session, limits=LIMITS)
    result = await judge.judge(ADD, "python", problem, sandbox=sb)
    assert result.verdict is Verdict.ACCEPTED and result.score == 1.0
    wrong = await judge.judge("print(3)\n", "python", problem, sandbox=sb)
    assert verdicts(wrong) == ["accepted", "wrong_answer", "wrong_answer", "wrong_answer"]
    assert wrong.score == 0.25
    public_only = from_codecontests(row, splits=["public"])
    assert len(public_only) == 1


async def test_apps_stdin_and_call_based(local_session: cwa.Session, sb: cwa.Sandbox) -> None:
    judge = Judge(local_session, limits=LIMITS)
    stdin_row = {"problem_id": 1, "input_output": json.dumps({"inputs": ["2 3\n", "4 4\n"], "outputs": ["5\n", "8\n"]})}
    assert (await judge.judge(ADD, "python", from_apps(stdin_row), sandbox=sb)).score == 1.0
    call_row = {
        "input_output": {"fn_name": "add", "inputs": [[1, 2], [3, 4], [[1], [2]]], "outputs": [[3], [7], [[1, 2]]]}
    }
    problem = from_apps(call_row)
    assert problem.fn_name == "add" and all(c.call for c in problem.cases)
    good = await judge.judge("def add(a, b):\n    print('noise')\n    return a + b\n", "python", problem, sandbox=sb)
    assert verdicts(good) == ["accepted"] * 3, good
    off = await judge.judge("def add(a, b):\n    return 3\n", "python", problem, sandbox=sb)
    assert verdicts(off) == ["accepted", "wrong_answer", "wrong_answer"]
    crash = await judge.judge("def add(a, b):\n    raise ValueError\n", "python", problem, sandbox=sb)
    assert verdicts(crash) == ["runtime_error"] * 3
    assert "ValueError" in crash.cases[0].stderr_tail


async def test_call_based_exit_early_is_not_a_pass(local_session: cwa.Session, sb: cwa.Sandbox) -> None:
    """Ending the process before returning (exit 0, even printing a plausible value) is not a pass."""
    judge = Judge(local_session, limits=LIMITS)
    problem = from_apps({"input_output": {"fn_name": "f", "inputs": [[1]], "outputs": [[2]]}})
    early = await judge.judge("import os\ndef f(x):\n    os._exit(0)\n", "python", problem, sandbox=sb)
    assert verdicts(early) == ["wrong_answer"]
    guess = await judge.judge("import sys\ndef f(x):\n    print(7)\n    sys.exit(0)\n", "python", problem, sandbox=sb)
    assert verdicts(guess) == ["runtime_error"] or verdicts(guess) == ["wrong_answer"]
    assert guess.score == 0.0


async def test_livecodebench_stdin_and_functional(local_session: cwa.Session, sb: cwa.Sandbox) -> None:
    judge = Judge(local_session, limits=LIMITS)
    stdin_row = {
        "question_id": "abc001",
        "public_test_cases": json.dumps([{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]),
        "private_test_cases": json.dumps([{"input": "2 2\n", "output": "4\n", "testtype": "stdin"}]),
        "metadata": "{}",
    }
    assert (await judge.judge(ADD, "python", from_livecodebench(stdin_row), sandbox=sb)).score == 1.0
    functional = {
        "public_test_cases": json.dumps([{"input": "[1, 2, 3]\n2", "output": "[2, 4, 6]", "testtype": "functional"}]),
        "private_test_cases": "",
        "metadata": json.dumps({"func_name": "scale"}),
    }
    problem = from_livecodebench(functional)
    code = "class Solution:\n    def scale(self, nums, k):\n        return [n * k for n in nums]\n"
    assert verdicts(await judge.judge(code, "python", problem, sandbox=sb)) == ["accepted"]


async def test_asserts_become_call_cases(local_session: cwa.Session, sb: cwa.Sandbox) -> None:
    judge = Judge(local_session, limits=LIMITS)
    problem = from_asserts(["assert is_even(2) == True", "assert not is_even(3)", "assert is_even(10)"])
    ok = await judge.judge("def is_even(n):\n    return n % 2 == 0\n", "python", problem, sandbox=sb)
    assert ok.score == 1.0
    bad = await judge.judge("def is_even(n):\n    return True\n", "python", problem, sandbox=sb)
    assert verdicts(bad) == ["accepted", "wrong_answer", "accepted"]
    human_eval = "def check(candidate):\n    assert candidate([1, 2]) == 3\n    assert candidate([]) == 0\n"
    total = await judge.judge(
        "def total(xs):\n    return sum(xs)\n", "python", from_asserts(human_eval, entry_point="total"), sandbox=sb
    )
    assert total.score == 1.0


async def test_comparison_modes(local_session: cwa.Session, sb: cwa.Sandbox) -> None:
    cases = [TestCase("", "0.333333\n1 2\n")]
    printed = "print(1/3)\nprint('1 2   ')\nprint()\n"
    results = {}
    for mode in ("exact", "whitespace", "float"):
        judge = Judge(local_session, compare=mode, limits=LIMITS)
        results[mode] = (await judge.judge(printed, "python", cases, sandbox=sb)).verdict
    assert results == {"exact": Verdict.WRONG_ANSWER, "whitespace": Verdict.WRONG_ANSWER, "float": Verdict.ACCEPTED}
    ws = Judge(local_session, compare="whitespace", limits=LIMITS)
    assert (await ws.judge("print('1 2   ')\nprint()\n", "python", [TestCase("", "1 2")], sandbox=sb)).score == 1.0


async def test_checker_runs_after_the_program_and_decides(local_session: cwa.Session, sb: cwa.Sandbox) -> None:
    # Any order of the numbers is accepted; the checker reads testlib's three files.
    source = (
        "import sys\n"
        "inp, out, ans = (open(p).read().split() for p in sys.argv[1:4])\n"
        "sys.exit(0 if sorted(out) == sorted(ans) else 1)\n"
    )
    judge = Judge(local_session, compare=Checker(source), limits=LIMITS)
    cases = [TestCase("3\n", "1 2 3\n"), TestCase("2\n", "1 2\n")]
    backwards = "n = int(input())\nprint(*range(n, 0, -1))\n"
    result = await judge.judge(backwards, "python", cases, sandbox=sb)
    assert verdicts(result) == ["accepted", "accepted"]
    short = await judge.judge("print(1)\n", "python", cases, sandbox=sb)
    assert verdicts(short) == ["wrong_answer", "wrong_answer"]
    crashed = await judge.judge("raise SystemExit(1)\n", "python", cases, sandbox=sb)
    assert verdicts(crashed) == ["runtime_error", "runtime_error"]  # never reached the checker


async def test_score_modes(local_session: cwa.Session, sb: cwa.Sandbox) -> None:
    program = (
        "import sys, time\nx = input()\nif x == 'crash': sys.exit(1)\nif x == 'sleep': time.sleep(600)\nprint(x)\n"
    )
    cases = [TestCase("a\n", "a\n"), TestCase("b\n", "wrong\n"), TestCase("crash\n", "c\n"), TestCase("sleep\n", "d\n")]
    fraction = await Judge(local_session, score="fraction", limits=LIMITS).judge(
        program, "python", cases[:3], sandbox=sb
    )
    assert fraction.score == pytest.approx(1 / 3)
    everything = await Judge(local_session, score="all", limits=LIMITS).judge(program, "python", cases[:3], sandbox=sb)
    assert everything.score == 0.0
    first = await Judge(local_session, score="first_failure", limits=LIMITS).judge(program, "python", cases, sandbox=sb)
    assert verdicts(first) == ["accepted", "wrong_answer", "skipped", "skipped"]
    assert first.score == 0.0
    assert first.cases[3].wall_seconds == 0.0  # the runner stopped at the crash: the sleeper never ran


async def test_missing_toolchain_is_a_typed_error_checked_once(local_session: cwa.Session) -> None:
    register_language(
        Language(
            name="nolang",
            source_file="x.nl",
            run=("no-such-runtime", "{src}"),
            version=("no-such-compiler", "--version"),
        )
    )
    judge = Judge(local_session)
    async with local_session.sandbox() as fresh:
        with pytest.raises(ToolchainError) as caught:
            await judge.judge("x", "nolang", [TestCase("", "")], sandbox=fresh)
        assert caught.value.language == "nolang" and not caught.value.infrastructure
        assert "not found" in str(caught.value)
        with pytest.raises(ToolchainError):
            await Judge(local_session).judge("x", "nolang", [TestCase("", "")], sandbox=fresh)
        assert fresh.exec_stats["exec_count"] == 1  # one version check, no runner: nothing was scored


async def test_bad_input_is_a_typed_error(local_session: cwa.Session) -> None:
    with pytest.raises(cwa.SandboxValidationError):
        Judge(local_session, compare="fuzzy")
    with pytest.raises(cwa.SandboxValidationError):
        Judge(local_session, score="most")
    judge = Judge(local_session)
    with pytest.raises(cwa.SandboxValidationError):
        await judge.judge("x", "cobol", [])
    with pytest.raises(cwa.SandboxValidationError):
        await judge.judge("x", "cpp", from_apps({"input_output": {"fn_name": "f", "inputs": [[1]], "outputs": [1]}}))
    with pytest.raises(cwa.SandboxValidationError):
        Limits(time_seconds=0)
    async with local_session.sandbox(resources=cwa.Resources(memory_mib=200, pids=32)) as small:
        with pytest.raises(cwa.SandboxValidationError, match="memory limit"):
            await judge.judge(ADD, "python", [TestCase("1 1\n", "2\n")], sandbox=small, limits=Limits(memory_mib=256))
        with pytest.raises(cwa.SandboxValidationError, match="pids"):
            await judge.judge("class Main {}", "java", [TestCase("", "")], sandbox=small, limits=Limits(memory_mib=32))
        assert small.exec_stats["exec_count"] == 0  # refused before anything ran


async def test_verdict_counts_reach_the_session_metrics(local_session: cwa.Session, sb: cwa.Sandbox) -> None:
    before = local_session.snapshot().judge
    judge = Judge(local_session, limits=LIMITS)
    await judge.judge(ADD, "python", [TestCase("1 1\n", "2\n"), TestCase("1 1\n", "3\n")], sandbox=sb)
    after = local_session.snapshot().as_dict()
    assert after["cwsandbox/judge_accepted"] - before.get("accepted", 0) == 1
    assert after["cwsandbox/judge_wrong_answer"] - before.get("wrong_answer", 0) == 1
    assert after["cwsandbox/judge_completions"] - before.get("completions", 0) == 1


async def test_judging_in_fresh_sandboxes_leaves_nothing_behind(local_session: cwa.Session) -> None:
    from local.conftest import child_pids, open_fds

    judge = Judge(local_session, limits=Limits(time_seconds=0.3, memory_mib=128))
    await judge.judge(ADD, "python", [TestCase("1 2\n", "3\n")])  # the backend's long-lived parts exist now
    before = (set(local_session.sandboxes), open_fds(), child_pids())
    for source in (ADD, "def f(:\n", "while True: pass\n", "import os\nos.fork() or os.fork()\nprint(3)\n"):
        await judge.judge(source, "python", [TestCase("1 2\n", "3\n")])  # a fresh sandbox each, stopped after
    assert (set(local_session.sandboxes), open_fds(), child_pids()) == before
