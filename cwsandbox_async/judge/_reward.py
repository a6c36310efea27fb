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

**The allow-list.** Only the languages the caller configured are judged: ``JudgeOptions.language``
plus ``JudgeOptions.languages``. A completion whose fence names another language the judge knows
(```` ```java ```` in a Python-only reward) is scored 0.0 as ``compile_error`` with that reason,
without a sandbox; a fence tag that names no language the judge knows is not a language choice
(```` ```text ````): the code is judged as ``JudgeOptions.language``. A ``language_column`` value
outside the allow-list is the caller's data disagreeing with its configuration:
``SandboxValidationError`` before the batch is scored. The first judgement in a session checks the
toolchain and the sandbox's memory floor of every allowed language (``ToolchainError`` /
``SandboxValidationError``: the caller's to fix), so a missing toolchain is never a program's score.
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
from ._judge import Judge, check_room
from ._languages import get_language
from ._plan import budget_seconds
from ._problem import Problem
from ._toolchains import VERSION_TIMEOUT_SECONDS
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
    ``score`` and ``limits`` as for ``Judge``; ``splits``: the CodeContests splits to use;
    ``languages``: more languages to judge besides ``language`` (the allow-list, see the module
    docstring). Raises ``SandboxValidationError`` for an unknown language or bad settings."""

    language: str = "python"
    language_column: str | None = None
    compare: str | Checker = "whitespace"
    score: str = "fraction"
    limits: Limits = field(default_factory=Limits)
    splits: tuple[str, ...] = CODECONTESTS_SPLITS
    languages: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        get_language(self.language)
        if isinstance(self.languages, str) or not isinstance(self.languages, (tuple, list)):
            raise SandboxValidationError("JudgeOptions.languages must be a tuple of language names")
        for lang in self.languages:
            get_language(lang)
        if not isinstance(self.limits, Limits):
            raise SandboxValidationError("JudgeOptions.limits must be a Limits")

    @property
    def allowed(self) -> tuple[str, ...]:
        """The canonical names of the languages judged: ``language`` first, then ``languages``."""
        names = [get_language(self.language).name, *(get_language(lang).name for lang in self.languages)]
        return tuple(dict.fromkeys(names))


@dataclass(frozen=True, slots=True)
class JudgeItem:
    """One completion to judge: its code, language and problem. ``refused`` says why it is not run
    (a language outside the allow-list): it scores 0.0 as ``compile_error`` with that reason."""

    code: str
    language: str
    problem: Problem
    refused: str = ""


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
            problem = problem_from_row(row, tests_column, self.options.splits)
            if lang_col is not None:
                language = get_language(str(row[lang_col])).name
                if language not in self.allowed:
                    raise SandboxValidationError(
                        f"row {i}: language {language!r} (column {lang_col!r}) is not among the judged "
                        f"languages {list(self.allowed)}: add it to JudgeOptions.languages"
                    )
                out.append(JudgeItem(code, language, problem))
                continue
            language = self._from_tag(tag)
            refused = ""
            if language not in self.allowed:
                refused = f"the completion is in {language}; this reward judges {', '.join(self.allowed)}"
            out.append(JudgeItem(code, language, problem, refused))
        return out

    @property
    def allowed(self) -> tuple[str, ...]:
        return self.options.allowed

    def _from_tag(self, tag: str | None) -> str:
        if tag:
            try:
                return get_language(tag).name
            except SandboxValidationError:
                pass
        return get_language(self.options.language).name

    def judge_for(self, session: Session) -> Judge:
        """The session's ``Judge`` (one per session)."""
        judge = self._judges.get(session)
        if judge is None:
            o = self.options
            judge = self._judges[session] = Judge(session, compare=o.compare, score=o.score, limits=o.limits)
        return judge

    def budget_seconds(self, items: Sequence[JudgeItem]) -> float:
        """The longest judging any of ``items`` can take (``Judge.budget_seconds``), plus the first
        judgement's checks of every allowed toolchain."""
        o = self.options
        checker = o.compare if isinstance(o.compare, Checker) else None
        judged = [i for i in items if not i.refused]
        longest = max(
            (budget_seconds(get_language(i.language), o.limits, len(i.problem.cases), checker) for i in judged),
            default=0.0,
        )
        return longest + VERSION_TIMEOUT_SECONDS * len(self.allowed)

    async def judge(self, session: Session, sandbox: Sandbox, item: JudgeItem) -> JudgeResult:
        """Judge ``item`` in ``sandbox``. The first time per session, every allowed language's toolchain
        and memory floor are checked first (``ToolchainError`` / ``SandboxValidationError``)."""
        judge = self.judge_for(session)
        for name in self.allowed:
            check_room(sandbox, get_language(name), self.options.limits)
        await judge.check_toolchains(self.allowed, sandbox=sandbox)
        return await judge.judge(item.code, item.language, item.problem, sandbox=sandbox)
