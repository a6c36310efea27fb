"""Every verdict in every listed language, on the local backend: one sandbox and two compiles per language.

One program per language acts on its input (``programs.py``), so one judgement of six cases checks
accepted, wrong answer, time limit (spinning, then sleeping), memory limit and runtime error, and a
broken source checks the compile error.
"""

from __future__ import annotations

import os
import shutil

import pytest

import cwsandbox_async as cwa
from cwsandbox_async.judge import Judge, Language, Limits, Verdict, get_language

from .conftest import RUST_TOOLCHAIN, rust_language
from .programs import BROKEN, CASES, EXPECTED, PROGRAMS

LIMITS = Limits(time_seconds=0.5, memory_mib=128)
TOOLS = {"python": "python3", "c": "gcc", "cpp": "g++", "java": "javac", "javascript": "node", "go": "go", "rust": None}


def language(name: str) -> Language:
    if name == "rust":
        if not os.path.isdir(RUST_TOOLCHAIN):
            pytest.skip("no Rust toolchain here")
        return rust_language()
    tool = TOOLS[name]
    if tool is not None and shutil.which(tool) is None and not os.path.exists(f"/usr/local/go/bin/{tool}"):
        pytest.skip(f"{tool} is not installed")
    return get_language(name)


#: Go's first compile in a fresh sandbox builds its standard packages (~17 s of CPU): a longer budget for that one.
PARAMS = [pytest.param(n, marks=pytest.mark.timeout(600)) if n == "go" else n for n in PROGRAMS]


@pytest.mark.parametrize("name", PARAMS)
async def test_every_verdict(local_session: cwa.Session, name: str) -> None:
    lang = language(name)
    judge = Judge(local_session, limits=LIMITS)
    async with local_session.sandbox() as sb:
        result = await judge.judge(PROGRAMS[name], lang, CASES, sandbox=sb)
        got = [c.verdict for c in result.cases]
        # a string, not a list: pytest shortens a list's repr, and the detail of the odd case is the evidence
        assert got == EXPECTED, "\n".join(
            f"{c.name}: {c.verdict.value}: {c.detail} {c.stderr_tail[-300:]!r}" for c in result.cases
        )
        assert result.score == pytest.approx(1 / 6)
        assert result.verdict is Verdict.WRONG_ANSWER
        assert result.cases[0].stdout.strip() == "5"
        broken = await judge.judge(BROKEN[name], lang, CASES, sandbox=sb)
        assert broken.verdict is Verdict.COMPILE_ERROR, broken
        assert {c.verdict for c in broken.cases} == {Verdict.COMPILE_ERROR}
        assert broken.score == 0.0
        assert broken.compile_output.strip(), "the compiler's message is kept"
