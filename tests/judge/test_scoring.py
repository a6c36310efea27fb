"""How verdicts become scores, and what the cases the runner never reported get, from synthetic reports."""

from __future__ import annotations

import signal

from cwsandbox_async.judge import CaseResult, TestCase, Verdict
from cwsandbox_async.judge._cases import unreported as _unreported
from cwsandbox_async.judge._runjob import Ended, JobReport, RawCase
from cwsandbox_async.judge._verdicts import classify, score, summary_verdict, suspect_starved

OK, WA, STARVED, INFRA = Verdict.ACCEPTED, Verdict.WRONG_ANSWER, Verdict.STARVED, Verdict.INFRASTRUCTURE


def cases(*verdicts: Verdict) -> list[CaseResult]:
    return [CaseResult(i, str(i), v) for i, v in enumerate(verdicts)]


def test_no_verdict_is_no_score_unless_a_failure_decided_it() -> None:
    assert score(cases(OK, OK), "fraction", 2) == 1.0
    assert score(cases(OK, WA), "fraction", 2) == 0.5
    assert score(cases(OK, STARVED), "fraction", 2) is None  # cannot know the fraction
    assert score(cases(OK, STARVED), "all", 2) is None
    assert score(cases(WA, STARVED), "all", 2) == 0.0  # a failure decides all-or-nothing anyway
    assert score(cases(INFRA, WA), "first_failure", 2) == 0.0
    assert summary_verdict(cases(OK, STARVED, WA)) is WA
    assert summary_verdict(cases(OK, INFRA)) is INFRA


def raw(**facts: object) -> RawCase:
    base: dict[str, object] = dict(
        index=0, exit_code=0, cpu_seconds=0.1, wall_seconds=0.2, memory_bytes=10 << 20, killed=None,
        wait_seconds=0.0, cgroup_oom=False, stdout=b"", stderr=b"",
    )  # fmt: skip
    base.update(facts)
    return RawCase(**base)  # type: ignore[arg-type]


def verdict(r: RawCase, exec_oom: bool = False) -> Verdict | None:
    decided = classify(r, time_seconds=1.0, memory_bytes=64 << 20, oom_markers=("std::bad_alloc",), exec_oom=exec_oom)
    return None if decided is None else decided[0]


def test_what_a_process_did_decides_its_verdict() -> None:
    assert verdict(raw()) is None  # exit 0: the output decides
    assert verdict(raw(cpu_seconds=1.2)) is Verdict.TIME_LIMIT  # finished, but past its CPU limit
    assert verdict(raw(exit_code=-signal.SIGXCPU)) is Verdict.TIME_LIMIT
    assert verdict(raw(killed="wall", wall_seconds=3.0, cpu_seconds=0.01)) is Verdict.TIME_LIMIT  # slept
    assert verdict(raw(memory_bytes=65 << 20)) is Verdict.MEMORY_LIMIT  # its peak, even if it exited 0
    assert verdict(raw(exit_code=-signal.SIGABRT, stderr=b"what(): std::bad_alloc")) is Verdict.MEMORY_LIMIT
    assert verdict(raw(exit_code=-signal.SIGKILL), exec_oom=True) is Verdict.MEMORY_LIMIT
    assert verdict(raw(exit_code=-signal.SIGKILL, cgroup_oom=True)) is Verdict.MEMORY_LIMIT
    assert verdict(raw(exit_code=-signal.SIGKILL)) is Verdict.RUNTIME_ERROR
    assert verdict(raw(killed="output")) is Verdict.WRONG_ANSWER
    assert verdict(raw(exit_code=3)) is Verdict.RUNTIME_ERROR


def test_only_a_case_that_waited_for_a_cpu_is_suspected_of_starving() -> None:
    assert suspect_starved(raw(killed="wall", wall_seconds=3.0, cpu_seconds=0.3, wait_seconds=2.0))
    assert not suspect_starved(raw(killed="wall", wall_seconds=3.0, cpu_seconds=0.3, wait_seconds=0.0))  # slept
    assert not suspect_starved(raw(killed="wall", wall_seconds=3.0, cpu_seconds=2.0, wait_seconds=1.0))  # busy
    assert not suspect_starved(raw(killed="time", wall_seconds=3.0, cpu_seconds=0.3, wait_seconds=2.0))


def test_cases_the_runner_never_reported() -> None:
    case = TestCase("", "")

    def first(ended: str, oom: bool = False) -> Verdict:
        return _unreported(0, case, JobReport(None, [], ended, oom_killed=oom), True).verdict

    assert first(Ended.STARVED) is STARVED
    assert first(Ended.INFRASTRUCTURE) is INFRA
    assert first(Ended.TIMED_OUT) is Verdict.TIME_LIMIT  # the program held its runner up
    assert first(Ended.RUNNER_KILLED) is Verdict.RUNTIME_ERROR  # the program killed its runner
    assert first(Ended.RUNNER_KILLED, oom=True) is Verdict.MEMORY_LIMIT
    assert first(Ended.COMPLETE) is Verdict.SKIPPED  # stopped at an earlier failure
    later = _unreported(1, case, JobReport(None, [], Ended.RUNNER_KILLED), False)
    assert later.verdict is Verdict.SKIPPED
