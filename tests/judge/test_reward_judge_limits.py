"""``code_reward(judge=...)`` against completions that test its edges: a language nobody configured, a
program that sleeps through every case, a syntax error; and ``Judge`` keeping a bounded amount per case.

Each test fails without the protection it names: the allow-list (``JudgeOptions.languages``), the
item deadline derived from the judge's budgets (``RewardCore._deadline``), the runner stopping at
the first failing case under ``score="all"``, the output cap and per-case excerpts, the reasons.
"""

from __future__ import annotations

import sys
import tracemalloc
from collections.abc import AsyncIterator

import pytest

import cwsandbox_async as cwa
from cwsandbox_async import SandboxValidationError
from cwsandbox_async.integrations.trl import VerdictKind, code_reward
from cwsandbox_async.judge import Judge, JudgeOptions, Language, Limits, TestCase, Verdict, register_language
from cwsandbox_async.judge._verdicts import STDOUT_KEPT_CHARS

SLEEPER = "```python\nimport time\ntime.sleep(60)\n```"
CASES = {"public_tests": {"input": ["1\n"], "output": ["1\n"]}}


def fence(tag: str, code: str) -> str:
    return f"```{tag}\n{code}\n```"


def test_the_allow_list_is_validated_when_made() -> None:
    with pytest.raises(SandboxValidationError):
        JudgeOptions(languages=("klingon",))
    with pytest.raises(SandboxValidationError):
        JudgeOptions(languages="cpp")  # type: ignore[arg-type]
    assert JudgeOptions(language="py", languages=("c++", "python", "go")).allowed == ("python", "cpp", "go")


async def test_a_language_nobody_configured_scores_zero(local_backend: None) -> None:
    """A known language outside the allow-list is never run: no toolchain check, no memory floor, 0.0."""
    register_language(Language(name="h2-absent", source_file="main.x", run=("h2-absent-run",), version=("h2-absent",)))
    reward = code_reward(
        name="allow",
        judge=JudgeOptions(limits=Limits(time_seconds=1, memory_mib=128)),
        pool_size=0,
        verbose=False,
        defaults=cwa.SandboxDefaults(resources=cwa.Resources(memory_mib=256)),  # below Java's floor (128 + 96 + 64 MiB)
    )
    try:
        completions = [
            fence("java", "public class Main { public static void main(String[] a) { System.out.println(1); } }"),
            fence("h2-absent", "print 1"),
            fence("python", "print(1)"),
        ]
        rewards = await reward(prompts=["p"] * 3, completions=completions, public_tests=[CASES["public_tests"]] * 3)
        assert rewards == [0.0, 0.0, 1.0]
        kinds = [v.kind for v in reward.last_verdicts]
        assert kinds == [VerdictKind.COMPILE_ERROR, VerdictKind.COMPILE_ERROR, VerdictKind.PASSED]
        assert "java" in reward.last_verdicts[0].reason and "h2-absent" in reward.last_verdicts[1].reason
    finally:
        await reward.aclose()


async def test_a_program_that_sleeps_through_many_cases_scores_zero(local_backend: None) -> None:
    """25 cases at a 1.4 s wall limit outlive the old deadline (lease + timeout + 30 s): 0.0, never None."""
    limits = Limits(time_seconds=0.1, wall_factor=1.0, wall_extra_seconds=1.3, memory_mib=128)
    tests = {"input": ["1\n"] * 25, "output": ["1\n"] * 25}
    reward = code_reward(
        name="sleepy",
        judge=JudgeOptions(limits=limits),
        pool_size=0,
        verbose=False,
        timeout_seconds=1,
        lease_timeout_seconds=1,
        starved_retries=0,
    )
    try:
        assert await reward(prompts=["p"], completions=[SLEEPER], public_tests=[tests]) == [0.0]
        verdict = reward.last_verdicts[0]
        assert verdict.kind is VerdictKind.TIMEOUT
        assert verdict.reason.startswith("timeout: 0/25 test cases accepted; case public/0: still running after")
        assert len(verdict.cases) == 25
    finally:
        await reward.aclose()


@pytest.fixture(scope="module")
async def sb(local_session: cwa.Session) -> AsyncIterator[cwa.Sandbox]:
    async with local_session.sandbox() as sandbox:
        yield sandbox


async def test_all_or_nothing_is_decided_by_the_first_failing_case(local_session: cwa.Session, sb: cwa.Sandbox) -> None:
    judge = Judge(local_session, score="all", limits=Limits(time_seconds=0.1, wall_extra_seconds=0.5))
    result = await judge.judge("import time\ntime.sleep(60)\n", "python", [TestCase("", "1\n")] * 60, sandbox=sb)
    assert result.score == 0.0
    assert [c.verdict for c in result.cases] == [Verdict.TIME_LIMIT] + [Verdict.SKIPPED] * 59


async def test_a_judgement_keeps_a_bounded_amount_per_case(local_session: cwa.Session, sb: cwa.Sandbox) -> None:
    """20 cases of 1 MiB wrong output against 2-byte answers: the result keeps an excerpt per case, and
    judging holds a few KiB per case, not the outputs (measured with tracemalloc, in this process)."""
    judge = Judge(local_session, limits=Limits(time_seconds=2.0, memory_mib=128, output_mib=1.0))
    spew = "import sys\nsys.stdout.write('x' * (1 << 20) + '\\n')\n"
    cases = [TestCase("", "3\n")] * 20
    await judge.judge("print(3)\n", "python", cases[:1], sandbox=sb)  # the toolchain check, once
    tracemalloc.start()
    try:
        result = await judge.judge(spew, "python", cases, sandbox=sb)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert {c.verdict for c in result.cases} == {Verdict.WRONG_ANSWER}
    kept = sum(sys.getsizeof(c.stdout) + sys.getsizeof(c.stderr_tail) + sys.getsizeof(c.detail) for c in result.cases)
    assert all(len(c.stdout) <= STDOUT_KEPT_CHARS for c in result.cases)
    assert kept < 20 * 4096
    assert peak < 8 * 2**20, f"judging held {peak / 2**20:.1f} MiB at its peak"


async def test_reasons_name_the_first_error_line(local_session: cwa.Session, sb: cwa.Sandbox) -> None:
    judge = Judge(local_session, limits=Limits(time_seconds=2.0, memory_mib=128))
    py = await judge.judge("x = 1\nif x\n    print(x)\n", "python", [TestCase("", "1\n")], sandbox=sb)
    assert py.verdict is Verdict.COMPILE_ERROR and py.score == 0.0
    assert py.reason.startswith("solution.py:2:") and "SyntaxError" in py.reason, py.reason
    assert "\n" not in py.reason
    cpp = '#include <cstdio>\nint main() {\n  int y = z + 1;\n  std::printf("%d", y);\n}\n'
    cc = await judge.judge(cpp, "cpp", [TestCase("", "1\n")], sandbox=sb)
    assert cc.verdict is Verdict.COMPILE_ERROR
    assert cc.reason.startswith("main.cpp:3:") and "error:" in cc.reason and "z" in cc.reason
    wrong = await judge.judge("print(2)\n", "python", [TestCase("", "1\n", name="public/0")], sandbox=sb)
    assert wrong.reason == "0/1 test cases accepted; case public/0: the output differs from the expected one"


async def test_code_reward_gives_the_judges_reason(local_backend: None) -> None:
    reward = code_reward(name="why", judge=JudgeOptions(), pool_size=0, verbose=False)
    try:
        assert await reward(
            prompts=["p"], completions=[fence("python", "def f(:\n")], public_tests=[CASES["public_tests"]]
        ) == [0.0]
        verdict = reward.last_verdicts[0]
        assert verdict.kind is VerdictKind.COMPILE_ERROR
        assert verdict.reason.startswith("compile_error: solution.py:1:") and "SyntaxError" in verdict.reason
    finally:
        await reward.aclose()
