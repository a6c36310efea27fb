"""``code_reward(judge=JudgeOptions(...))``: TRL-shaped calls judged against the rows' test cases."""

from __future__ import annotations

import json

import pytest

from cwsandbox_async import SandboxValidationError
from cwsandbox_async.integrations.trl import code_reward
from cwsandbox_async.judge import JudgeOptions, Limits, TestCase
from cwsandbox_async.judge._reward import JudgeScoring, extract_fenced, problem_from_row

CPP = "```cpp\n#include <iostream>\nint main() { long a, b; std::cin >> a >> b; std::cout << a + b; }\n```"
PY = "<answer>\n```python\na, b = map(int, input().split())\nprint(a - b)\n```\n</answer>"
PUBLIC = {"input": ["1 2\n"], "output": ["3\n"]}
PRIVATE = {"input": ["5 5\n", "0 0\n"], "output": ["10\n", "0\n"]}


def test_extract_fenced_finds_the_language_and_code() -> None:
    assert extract_fenced(CPP) == ("cpp", CPP.split("\n", 1)[1].rsplit("\n```", 1)[0])
    assert extract_fenced(PY) == ("python", "a, b = map(int, input().split())\nprint(a - b)")
    assert extract_fenced("```\nprint(1)\n```") == (None, "print(1)")
    assert extract_fenced("no code here") is None
    assert extract_fenced("```java\n   \n```") is None


def test_rows_of_every_shape_become_problems() -> None:
    splits = ("public", "private", "generated")
    cc = problem_from_row({"public_tests": PUBLIC, "private_tests": PRIVATE, "generated_tests": None}, None, splits)
    assert [c.name for c in cc.cases] == ["public/0", "private/0", "private/1"]
    apps = problem_from_row({"input_output": json.dumps({"inputs": ["1\n"], "outputs": ["1\n"]})}, None, splits)
    assert len(apps.cases) == 1 and apps.fn_name is None
    lcb = {"public_test_cases": json.dumps([{"input": "1\n", "output": "1\n", "testtype": "stdin"}]), "metadata": "{}"}
    assert len(problem_from_row(lcb, None, splits).cases) == 1
    asserts = problem_from_row({"tests": ["assert f(1) == 2"]}, "tests", splits)
    assert asserts.fn_name == "f" and asserts.cases[0].call
    own = problem_from_row({"tests": [TestCase("1\n", "1\n")]}, "tests", splits)
    assert len(own.cases) == 1
    with pytest.raises(SandboxValidationError):
        problem_from_row({"other": 1}, "tests", splits)


def test_items_take_the_language_from_the_column_then_the_fence() -> None:
    scoring = JudgeScoring(JudgeOptions(languages=("c++",)))
    items = scoring.items([CPP, PY, "nothing"], {"public_tests": [PUBLIC] * 3, "trainer_state": None}, None)
    assert [i.language if i else None for i in items] == ["cpp", "python", None]
    assert [i.refused if i else None for i in items] == ["", "", None]
    by_column = JudgeScoring(JudgeOptions(language_column="lang", languages=("cpp",)))
    items = by_column.items([CPP], {"public_tests": [PUBLIC], "lang": ["c++"]}, None)
    assert items[0] is not None and items[0].language == "cpp"
    with pytest.raises(SandboxValidationError):
        by_column.items([CPP], {"public_tests": [PUBLIC]}, None)


async def test_code_reward_judges_codecontests_columns(local_backend: None) -> None:
    reward = code_reward(
        name="judged",
        judge=JudgeOptions(limits=Limits(time_seconds=2, memory_mib=256), languages=("cpp",)),
        pool_size=0,
        verbose=False,
    )
    try:
        rewards = await reward(
            prompts=["add"] * 3,
            completions=[CPP, PY, "I do not know."],
            public_tests=[PUBLIC] * 3,
            private_tests=[PRIVATE] * 3,
            generated_tests=[None] * 3,
        )
        # C++ passes all three cases; the Python one subtracts: only "0 0" is right (1 of 3).
        assert rewards == [1.0, pytest.approx(1 / 3), None]
        stats = reward.last_stats
        assert stats is not None and (stats.sandboxes, stats.passed, stats.skipped, stats.infra_failures) == (
            2,
            1,
            1,
            0,
        )
    finally:
        await reward.aclose()
