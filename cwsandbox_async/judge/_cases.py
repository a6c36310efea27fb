"""From one reported case (or one the runner never reported) to its ``CaseResult``.

A case that ended normally is compared here (``_compare``); its output is then dropped: the result
keeps an excerpt (``STDOUT_KEPT_CHARS``) and the stderr tail, so a judgement's memory does not grow
with what its cases printed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._checker import Checker
from ._compare import compare_call, compare_text, expected_bytes
from ._languages import Language
from ._runjob import Ended, JobReport, RawCase, Step
from ._types import CaseResult, TestCase, Verdict
from ._verdicts import classify, excerpt, tail

__all__ = ["CaseDecider", "stop_at_first_failure", "timed_out", "unreported"]

#: The stderr kept per case (its end).
STDERR_KEPT_CHARS = 1000


@dataclass(frozen=True, slots=True)
class CaseDecider:
    """Decides a reported case: its limits first (``classify``), then its output against the expected one."""

    compare: str | Checker
    rel_tol: float
    abs_tol: float
    step: Step
    lang: Language
    exec_oom: bool

    def __call__(self, i: int, case: TestCase, r: RawCase) -> CaseResult:
        facts: dict[str, Any] = {
            "exit_code": r.exit_code,
            "cpu_seconds": r.cpu_seconds,
            "wall_seconds": r.wall_seconds,
            "memory_bytes": r.memory_bytes,
            "stdout": excerpt(r.stdout),
            "stderr_tail": tail(r.stderr, STDERR_KEPT_CHARS),
        }
        decided = classify(
            r,
            time_seconds=self.step.time_seconds,
            memory_bytes=self.step.memory_bytes,
            oom_markers=self.lang.oom_markers,
            exec_oom=self.exec_oom,
        )
        if decided is not None:
            return CaseResult(i, case.name, decided[0], detail=decided[1], **facts)
        if isinstance(self.compare, Checker):
            return CaseResult(i, case.name, Verdict.ACCEPTED, detail="to be checked", **facts)
        tol = {"rel_tol": self.rel_tol, "abs_tol": self.abs_tol}
        if case.call:
            ok = compare_call(self.compare, r.stdout, case.expected, **tol)
        else:
            ok = compare_text(self.compare, r.stdout, expected_bytes(case.expected), **tol)
        if ok:
            return CaseResult(i, case.name, Verdict.ACCEPTED, **facts)
        detail = f"the {'value' if case.call else 'output'} differs from the expected one"
        return CaseResult(i, case.name, Verdict.WRONG_ANSWER, detail=detail, **facts)


def timed_out(first: RawCase) -> RawCase:
    """A case whose rerun ended without a report and not starved: its first run, as a time limit."""
    return RawCase(
        first.index,
        -9,
        first.cpu_seconds,
        first.wall_seconds,
        first.memory_bytes,
        "time",
        0.0,
        False,
        first.stdout,
        first.stderr,
    )


def unreported(i: int, case: TestCase, report: JobReport, first: bool) -> CaseResult:
    """A case the runner never reported: the one in flight takes the blame for how the exec ended."""
    if report.ended == Ended.STARVED:
        return CaseResult(i, case.name, Verdict.STARVED, detail=report.detail)
    if report.ended == Ended.INFRASTRUCTURE:
        return CaseResult(i, case.name, Verdict.INFRASTRUCTURE, detail=report.detail)
    if not first or report.ended == Ended.COMPLETE:
        return CaseResult(i, case.name, Verdict.SKIPPED, detail="not run: judging stopped before it")
    if report.ended == Ended.TIMED_OUT:
        return CaseResult(i, case.name, Verdict.TIME_LIMIT, detail="the program held the judging up past its time")
    verdict = Verdict.MEMORY_LIMIT if report.oom_killed else Verdict.RUNTIME_ERROR
    return CaseResult(i, case.name, verdict, detail=report.detail)


def stop_at_first_failure(results: list[CaseResult]) -> list[CaseResult]:
    """``score="first_failure"``: the cases after the first failing one are ``SKIPPED``."""
    out: list[CaseResult] = []
    failed = False
    for r in results:
        if failed:
            out.append(CaseResult(r.index, r.name, Verdict.SKIPPED, detail="not counted: an earlier case failed"))
            continue
        out.append(r)
        failed = not r.passed and not r.verdict.not_scored
    return out
