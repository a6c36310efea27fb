"""Judging completions against test cases: stdin/stdout and call-based problems, many languages.

``Judge(session).judge(source, "cpp", cases)`` compiles ``source`` once in a sandbox, runs it
against every case (one fresh process per case, each with its own time and memory limit, all in
one exec), compares the outputs in the driver and returns per-case verdicts and a score. The
dataset adapters turn APPS/TACO, CodeContests, LiveCodeBench and assert-style rows into cases.
See ``docs/judge.md``.
"""

from ._checker import Checker
from ._compare import COMPARE_MODES
from ._datasets import from_apps, from_asserts, from_codecontests, from_livecodebench, from_taco
from ._judge import Judge
from ._languages import LANGUAGES, Language, get_language, register_language
from ._problem import Problem
from ._reward import JudgeOptions
from ._types import CaseResult, JudgeError, JudgeResult, Limits, TestCase, ToolchainError, Verdict

__all__ = [
    "COMPARE_MODES",
    "LANGUAGES",
    "CaseResult",
    "Checker",
    "Judge",
    "JudgeError",
    "JudgeOptions",
    "JudgeResult",
    "Language",
    "Limits",
    "Problem",
    "TestCase",
    "ToolchainError",
    "Verdict",
    "from_apps",
    "from_asserts",
    "from_codecontests",
    "from_livecodebench",
    "from_taco",
    "get_language",
    "register_language",
]
