"""A case re-run because it was starved runs with CPU priority, so an infinite loop gets its CPU limit even on
a loaded machine (issue 37: a penalty that survives overload; the split harness's retry does the same).

Starvation cannot be ordered on demand here, so the judge's test for it (``suspect_starved``) is made to
say "starved" for each case's first run: the re-run path is then the real one, on a real sandbox.
"""

from __future__ import annotations

from typing import Any

import pytest

import cwsandbox_async as cwa
from cwsandbox_async.judge import Judge, Limits, TestCase, Verdict
from cwsandbox_async.judge import _judge as judge_module

LIMITS = Limits(time_seconds=1.0, memory_mib=128)
LOOP = "while True:\n    pass\n"
ADD = "a, b = map(int, input().split())\nprint(a + b)\n"
CASES = [TestCase(input="1 2\n", expected="3\n")]


@pytest.fixture
def starved_once(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every case's first run counts as starved; returns the options of every exec the judge runs."""
    seen: set[int] = set()

    def first_run_starved(raw: Any) -> bool:
        first = id(raw) not in seen and len(seen) == 0
        seen.add(id(raw))
        return first

    monkeypatch.setattr(judge_module, "suspect_starved", first_run_starved)
    calls: list[dict[str, Any]] = []
    original = cwa.Sandbox.run_python

    async def recording(self: cwa.Sandbox, source: str, **kwargs: Any) -> cwa.ExecResult:
        calls.append(kwargs)
        return await original(self, source, **kwargs)

    monkeypatch.setattr(cwa.Sandbox, "run_python", recording)
    return calls


async def test_a_starved_loop_is_rerun_with_cpu_priority_and_scores_its_time_limit(
    local_session: cwa.Session, starved_once: list[dict[str, Any]]
) -> None:
    async with local_session.sandbox() as sb:
        result = await Judge(local_session, limits=LIMITS).judge(LOOP, "python", CASES, sandbox=sb)
    assert (result.verdict, result.score) == (Verdict.TIME_LIMIT, 0.0), result
    reruns = [c for c in starved_once if c.get("cpu_priority")]
    assert len(reruns) == 1, starved_once
    budget = reruns[0]["cpu_seconds"]
    assert budget is not None and budget >= LIMITS.time_seconds and reruns[0]["exclusive"] is True


async def test_a_starved_correct_program_is_rerun_with_priority_and_accepted(
    local_session: cwa.Session, starved_once: list[dict[str, Any]]
) -> None:
    async with local_session.sandbox() as sb:
        result = await Judge(local_session, limits=LIMITS).judge(ADD, "python", CASES, sandbox=sb)
    assert (result.verdict, result.score) == (Verdict.ACCEPTED, 1.0), result
    assert [c.get("cpu_priority") for c in starved_once if c.get("cpu_priority")] == [True]
