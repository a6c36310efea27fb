"""The judge behind the bundled rewards (``code_reward(judge=JudgeOptions(...))``): rows to problems.

Per completion, TRL passes every dataset column (one value per completion). The row's test cases
are read from its columns by shape:

- ``input_output`` (APPS/TACO; with ``fn_name`` inside it or as a column): ``from_apps``;
- ``public_tests`` / ``private_tests`` / ``generated_tests`` (CodeContests): ``from_codecontests``
  (the splits in ``JudgeOptions.splits``);
- ``public_test_cases`` / ``private_test_cases`` / ``metadata`` (LiveCodeBench): ``from_livecodebench``;
- else the ``tests_column``: a ``Problem``, a list of ``TestCase``, one of the shapes above as a
  dict, or assert-style tests (a str or a list of str: ``from_asserts``).

The language is the row's ``language_column`` if given, else the completion's fence tag
(```` ```cpp ````), else ``JudgeOptions.language``. The code is the last ``<answer>`` block (a fence
inside it stripped), else the last fenced block of any language.
"""

from __future__ import annotations

import re
import textwrap
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._errors import SandboxValidationError
from ._checker import Checker
from ._datasets import CODECONTESTS_SPLITS, from_apps, from_asserts, from_codecontests, from_livecodebench
from ._judge import Judge
from ._languages import get_language
from ._problem import Problem
from ._types import Limits, TestCase

if TYPE_CHECKING:
    from .._sandbox import Sandbox
    from .._session import Session
    from ._types import JudgeResult

__all__ = ["JudgeItem", "JudgeOptions", "JudgeScoring", "extract_fenced", "problem_from_row"]

_ANSWER = re.compile(r"<answer>(.*?)(?:</answer>|\Z)", re.DOTALL | re.IGNORECASE)
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+#.-]*)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)
_NOT_COLUMNS = frozenset({"trainer_state", "log_extra", "log_metric", "environments", "completion_ids"})


@dataclass(frozen=True, slots=True)
class JudgeOptions:
    """How the rewards judge: ``language_column`` (or the fence, or ``language``), ``compare``,
    ``score`` and ``limits`` as for ``Judge``; ``splits``: the CodeContests splits to use."""

    language: str = "python"
    language_column: str | None = None
    compare: str | Checker = "whitespace"
    score: str = "fraction"
    limits: Limits = field(default_factory=Limits)
    splits: tuple[str, ...] = CODECONTESTS_SPLITS

    def __post_init__(self) -> None:
        get_language(self.language)


@dataclass(frozen=True, slots=True)
class JudgeItem:
    """One completion to judge: its code, language and problem."""

    code: str
    language: str
    problem: Problem


def extract_fenced(text: str) -> tuple[str | None, str] | None:
    """``(fence tag or None, code)`` of the last ``<answer>`` block or fenced block; ``None`` without code."""
    if not isinstance(text, str):
        return None
    answers = _ANSWER.findall(text)
    if answers:
        inner = answers[-1]
        fence = _FENCE.search(inner)
        tag, code = (fence.group(1) or None, fence.group(2)) if fence else (None, inner)
    else:
        fences = _FENCE.findall(text)
        if not fences:
            return None
        tag, code = fences[-1][0] or None, fences[-1][1]
    code = textwrap.dedent(code).strip("\n")
    return (tag, code) if code.strip() else None


def problem_from_row(row: Mapping[str, Any], tests_column: str | None, splits: Sequence[str]) -> Problem:
    """The row's test cases, by its shape (see the module docstring); ``SandboxValidationError`` when none fits."""
    if row.get("input_output") is not None:
        return from_apps(row)
    if any(row.get(f"{s}_tests") is not None for s in CODECONTESTS_SPLITS):
        return from_codecontests(row, splits=[s for s in splits if row.get(f"{s}_tests") is not None])
    if row.get("public_test_cases") is not None:
        return from_livecodebench(row)
    value = row.get(tests_column) if tests_column else None
    if isinstance(value, Problem):
        return value
    if isinstance(value, Sequence) and value and all(isinstance(v, TestCase) for v in value):
        return Problem(tuple(value))
    if isinstance(value, Mapping):
        return problem_from_row(value, None, splits)
    if isinstance(value, str) or (isinstance(value, Sequence) and value and all(isinstance(v, str) for v in value)):
        return from_asserts(value)
    raise SandboxValidationError(
        f"no test cases in the row: expected APPS/CodeContests/LiveCodeBench columns or tests in {tests_column!r}"
    )


class JudgeScoring:
    """Turns a reward call's completions and columns into ``JudgeItem`` s, and judges one."""

    def __init__(self, options: JudgeOptions) -> None:
        if not isinstance(options, JudgeOptions):
            raise SandboxValidationError("judge must be a JudgeOptions")
        self.options = options
        self._judges: weakref.WeakKeyDictionary[Session, Judge] = weakref.WeakKeyDictionary()

    def items(
        self, texts: Sequence[str], kwargs: Mapping[str, Any], tests_column: str | None
    ) -> list[JudgeItem | None]:
        """One item per completion text (``None`` where it holds no code)."""
        n = len(texts)
        columns = {}
        for key, values in kwargs.items():
            if key in _NOT_COLUMNS:
                continue
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) != n:
                raise SandboxValidationError(f"reward kwarg {key!r} must be a list with one entry per completion ({n})")
            columns[key] = values
        lang_col = self.options.language_column
        if lang_col is not None and lang_col not in columns:
            raise SandboxValidationError(f"language column {lang_col!r} is not among the reward kwargs")
        out: list[JudgeItem | None] = []
        for i, text in enumerate(texts):
            found = extract_fenced(text)
            if found is None:
                out.append(None)
                continue
            tag, code = found
            row = {key: values[i] for key, values in columns.items()}
            language = str(row[lang_col]) if lang_col is not None else self._from_tag(tag)
            problem = problem_from_row(row, tests_column, self.options.splits)
            out.append(JudgeItem(code, get_language(language).name, problem))
        return out

    def _from_tag(self, tag: str | None) -> str:
        if tag:
            try:
                return get_language(tag).name
            except SandboxValidationError:
                pass
        return self.options.language

    async def judge(self, session: Session, sandbox: Sandbox, item: JudgeItem) -> JudgeResult:
        judge = self._judges.get(session)
        if judge is None:
            o = self.options
            judge = self._judges[session] = Judge(session, compare=o.compare, score=o.score, limits=o.limits)
        return await judge.judge(item.code, item.language, item.problem, sandbox=sandbox)
