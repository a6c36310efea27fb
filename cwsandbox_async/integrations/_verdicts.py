"""Why each completion scored what it did: ``CompletionVerdict``, one per completion of a reward call.

``code_reward`` keeps the last call's verdicts in ``last_verdicts`` (beside
``last_stats``), passes them to ``on_verdicts``, logs each at DEBUG with its
completion index, and counts their kinds in the printed line. The kinds:

========================  =====  ==========================================================
kind                      score  what happened
========================  =====  ==========================================================
``passed``                1.0    the program and its tests ran to their end
``wrong_answer``          0.0    a test failed (an ``assert``, or a test raised)
``error_exit``            0.0    the program raised, exited non-zero, or killed the harness
``early_exit``            0.0    the program ended its process before its tests finished
``timeout``               0.0    it ran past ``timeout_seconds`` (not starved, or starved
                                 and it used its CPU time on a retry)
``cpu_budget``            0.0    it exceeded a CPU budget (``Resources.cpu_seconds``)
``oom``                   0.0    it was killed for its memory
``compile_error``         0.0    its source did not compile (the reason: file, line and
                                 the interpreter's or compiler's message)
``partial``               0..1   (judged, ``score="fraction"``) some test cases failed
``no_code``               None   the completion holds no code
``starved``               None   its timeout fired while others held the CPUs, and still
                                 did on every retry: not scored
``infrastructure``        None   the platform failed (a sandbox died for outside reasons,
                                 the backend broke, the item deadline passed)
========================  =====  ==========================================================
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, assert_never

if TYPE_CHECKING:
    from .._types import ExecResult
    from ..judge._types import JudgeResult

__all__ = ["STDERR_TAIL_CHARS", "CompletionVerdict", "VerdictKind", "from_result", "judged_verdict"]

#: How much of a program's stderr a verdict keeps (its end).
STDERR_TAIL_CHARS = 500


class VerdictKind(enum.StrEnum):
    """How one completion's program ended (see the module docstring)."""

    PASSED = "passed"
    WRONG_ANSWER = "wrong_answer"
    ERROR_EXIT = "error_exit"
    EARLY_EXIT = "early_exit"
    TIMEOUT = "timeout"
    CPU_BUDGET = "cpu_budget"
    OOM = "oom"
    COMPILE_ERROR = "compile_error"
    PARTIAL = "partial"
    NO_CODE = "no_code"
    STARVED = "starved"
    INFRASTRUCTURE = "infrastructure"

    @property
    def rank(self) -> int:
        """How bad the kind is, worst first (0): what was not scored, then what hung or was killed, then
        what failed, then ``no_code`` and ``passed``. Total: mypy rejects a kind this leaves out."""
        match self:
            case VerdictKind.INFRASTRUCTURE:
                return 0
            case VerdictKind.STARVED:
                return 1
            case VerdictKind.TIMEOUT:
                return 2
            case VerdictKind.OOM:
                return 3
            case VerdictKind.CPU_BUDGET:
                return 4
            case VerdictKind.EARLY_EXIT:
                return 5
            case VerdictKind.ERROR_EXIT:
                return 6
            case VerdictKind.COMPILE_ERROR:
                return 7
            case VerdictKind.WRONG_ANSWER:
                return 8
            case VerdictKind.PARTIAL:
                return 9
            case VerdictKind.NO_CODE:
                return 10
            case VerdictKind.PASSED:
                return 11
            case _:
                assert_never(self)

    @property
    def scored(self) -> bool:
        """Whether the kind gets a score (1.0 / 0.0); ``no_code``, ``starved`` and ``infrastructure`` get None."""
        return self not in (VerdictKind.NO_CODE, VerdictKind.STARVED, VerdictKind.INFRASTRUCTURE)


@dataclass(frozen=True, slots=True)
class CompletionVerdict:
    """One completion's verdict. ``index``: its position in the batch; ``score``: what the reward returned.

    ``exit_code``, ``wall_seconds``, ``cpu_seconds`` are the last run's (``None`` when no program
    ran or the run left no result); ``stderr_tail`` its last ``STDERR_TAIL_CHARS`` characters;
    ``retries`` how many times a starved run was re-run; ``cases`` per-test-case detail from judges
    that report it (empty for assert-style tests).
    """

    index: int
    kind: VerdictKind
    score: float | None
    reason: str = ""
    exit_code: int | None = None
    wall_seconds: float | None = None
    cpu_seconds: float | None = None
    stderr_tail: str = ""
    retries: int = 0
    sandbox_id: str | None = None
    cases: tuple[object, ...] = ()

    def as_dict(self) -> dict[str, object]:
        """Plain data (for logs and tables); ``kind`` as its string."""
        return {
            "index": self.index,
            "kind": str(self.kind),
            "score": self.score,
            "reason": self.reason,
            "exit_code": self.exit_code,
            "wall_seconds": self.wall_seconds,
            "cpu_seconds": self.cpu_seconds,
            "stderr_tail": self.stderr_tail,
            "retries": self.retries,
        }


def tail(data: bytes) -> str:
    """The end of a program's stderr, decoded with replacement."""
    return data[-STDERR_TAIL_CHARS * 4 :].decode("utf-8", errors="replace")[-STDERR_TAIL_CHARS:]


def from_result(
    index: int, result: ExecResult, kind: VerdictKind, reason: str, *, retries: int = 0
) -> CompletionVerdict:
    """A verdict of ``kind`` with the facts of ``result``; the score follows from the kind."""
    score = None if not kind.scored else (1.0 if kind is VerdictKind.PASSED else 0.0)
    return CompletionVerdict(
        index=index,
        kind=kind,
        score=score,
        reason=reason,
        exit_code=result.returncode,
        wall_seconds=result.wall_seconds,
        cpu_seconds=result.cpu_seconds,
        stderr_tail=tail(result.stderr_bytes),
        retries=retries,
        sandbox_id=result.sandbox_id,
    )


def _judged_kind(result: JudgeResult) -> VerdictKind:
    from ..judge._types import Verdict

    if result.score is None:
        return VerdictKind.STARVED if result.verdict is Verdict.STARVED else VerdictKind.INFRASTRUCTURE
    if result.verdict is Verdict.ACCEPTED:
        return VerdictKind.PASSED if result.score == 1.0 else VerdictKind.PARTIAL
    if result.score > 0.0:
        return VerdictKind.PARTIAL
    return {
        Verdict.WRONG_ANSWER: VerdictKind.WRONG_ANSWER,
        Verdict.TIME_LIMIT: VerdictKind.TIMEOUT,
        Verdict.MEMORY_LIMIT: VerdictKind.OOM,
        Verdict.COMPILE_ERROR: VerdictKind.COMPILE_ERROR,
    }.get(result.verdict, VerdictKind.ERROR_EXIT)


def judged_verdict(index: int, result: JudgeResult, sandbox_id: str | None) -> CompletionVerdict:
    """A judge's result as a completion's verdict: the judge's score, a kind from its overall verdict,
    the first failing case's facts, and every case in ``cases``."""
    from ..judge._types import Verdict

    failing = next((c for c in result.cases if c.verdict is not Verdict.ACCEPTED), None)
    reason = f"{result.verdict.value}: {result.passed}/{len(result.cases)} test cases accepted"
    if result.verdict is Verdict.COMPILE_ERROR:
        said = [line.strip() for line in (result.compile_output or "").splitlines() if line.strip()]
        reason = "compile error" + (f": {said[0][:300]}" if said else "")
    elif failing is not None and failing.detail:
        reason += f"; case {failing.name or failing.index}: {failing.detail}"
    return CompletionVerdict(
        index=index,
        kind=_judged_kind(result),
        score=result.score,
        reason=reason,
        exit_code=failing.exit_code if failing is not None else 0,
        wall_seconds=sum(c.wall_seconds for c in result.cases) + result.compile_seconds,
        cpu_seconds=sum(c.cpu_seconds for c in result.cases),
        stderr_tail=(result.compile_output or (failing.stderr_tail if failing else ""))[-STDERR_TAIL_CHARS:],
        sandbox_id=sandbox_id,
        cases=result.cases,
    )
