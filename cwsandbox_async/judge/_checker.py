"""Checker programs: a problem's own judge of an output, run in the sandbox as its own process.

``Checker(source, language="python")`` is compiled (if its language compiles) and run once per case
that ended normally, as ``<run argv> input.txt output.txt expected.txt`` (testlib's order: the
case's input, the program's output, the expected answer) in a fresh directory with an unguessable
name. Exit 0 accepts; any other exit (testlib: 1 wrong answer, 2 presentation error), a crash or a
checker that runs out of time is a wrong answer (the program's output may be what broke it), with
the checker's output as the detail.

It runs in one exclusive exec after the program's: every process of the completion has been
killed before the checker is written, compiled or run, so nothing of the program can touch it;
the expected answers enter the sandbox only then. A checker that does not compile raises
``JudgeError`` (the caller's to fix). A checker whose time ran out while it was starved of CPU is
run again alone, then the case is ``STARVED``.
"""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._errors import SandboxValidationError
from ._compare import expected_bytes
from ._languages import Language, get_language
from ._runjob import Ended, Step, run_job
from ._toolchains import fill
from ._types import CaseResult, JudgeError, TestCase, Verdict
from ._verdicts import suspect_starved, tail

if TYPE_CHECKING:
    from .._sandbox import Sandbox
    from ._judge import Judge

__all__ = ["Checker", "run_checker"]

FILES = ("input.txt", "output.txt", "expected.txt")


@dataclass(frozen=True, slots=True)
class Checker:
    """A checker program (``source`` in ``language``), with its own per-case limits."""

    source: str
    language: str | Language = "python"
    time_seconds: float = 5.0
    memory_mib: int = 512

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or not self.source.strip():
            raise SandboxValidationError("Checker.source must be non-empty source text")
        get_language(self.language)


async def run_checker(
    checker: Checker,
    sb: Sandbox,
    cases: list[TestCase],
    results: list[CaseResult],
    outputs: dict[int, bytes],
    judge: Judge,
) -> list[CaseResult]:
    """``results`` with every "to be checked" case decided by the checker."""
    todo = [r for r in results if r.verdict is Verdict.ACCEPTED]
    if not todo:
        return results
    lang = get_language(checker.language)
    await judge.check_toolchains([lang], sandbox=sb)
    work = f"/tmp/.checker-{uuid.uuid4().hex}"
    cls = lang.class_name(checker.source)
    src = f"{work}/{lang.source_file.replace('{class}', cls)}"
    values = {"dir": work, "src": src, "exe": f"{work}/main", "class": cls, "cache": "/tmp/cwsandbox-judge-cache"}
    values["memory_mib"] = str(checker.memory_mib)
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
    env.update({k: fill((v,), values)[0] for k, v in lang.env.items()})
    step = Step(
        argv=[*fill(lang.run, values), *FILES],
        cwd=work,
        env=env,
        time_seconds=checker.time_seconds,
        wall_seconds=checker.time_seconds * 2 + 1,
        memory_bytes=None,
        output_bytes=64 * 1024,
        stderr_bytes=4096,
    )
    compile_step = None
    if lang.compile is not None:
        compile_step = dataclasses.replace(
            step,
            argv=fill(lang.compile, values),
            time_seconds=lang.compile_seconds,
            wall_seconds=2 * lang.compile_seconds,
        )
    inputs = [[b"", cases[r.index].stdin_bytes(), outputs.get(r.index, b""), _want(cases[r.index])] for r in todo]
    report = await run_job(
        sb,
        step=step,
        inputs=inputs,
        compile_step=compile_step,
        mkdirs=[work, f"{work}/home", "/tmp/cwsandbox-judge-cache"],
        write={src: checker.source.encode()},
        files=FILES,
    )
    if compile_step is not None and (report.compile is None or report.compile.exit_code != 0):
        if report.ended in (Ended.STARVED, Ended.INFRASTRUCTURE):
            return [_unscored(r, report.ended) if r in todo else r for r in results]
        why = tail(report.compile.stderr + report.compile.stdout) if report.compile else report.detail
        raise JudgeError(f"the checker does not compile: {why}")
    decided = {r.index: r for r in report.cases}
    out: list[CaseResult] = []
    for r in results:
        if r.verdict is not Verdict.ACCEPTED:
            out.append(r)
            continue
        k = todo.index(r)
        raw = decided.get(k)
        if raw is not None and suspect_starved(raw):
            again = await run_job(
                sb, step=step, inputs=[inputs[k]], files=FILES, exec_timeout_seconds=step.wall_seconds + 1
            )
            raw = again.cases[0] if again.cases else None
            if raw is None and again.ended == Ended.STARVED:
                out.append(_unscored(r, Ended.STARVED))
                continue
        if raw is None:
            ended = report.ended if report.ended in (Ended.STARVED, Ended.INFRASTRUCTURE) else None
            out.append(
                _unscored(r, ended)
                if ended
                else dataclasses.replace(r, verdict=Verdict.WRONG_ANSWER, detail="the checker did not finish")
            )
        elif raw.exit_code == 0 and raw.killed is None:
            out.append(dataclasses.replace(r, detail=tail(raw.stdout + raw.stderr, 500)))
        else:
            why = (
                f"checker: {tail(raw.stdout + raw.stderr, 500).strip()}"
                if raw.killed is None
                else f"checker {raw.killed} limit"
            )
            out.append(dataclasses.replace(r, verdict=Verdict.WRONG_ANSWER, detail=why))
    return out


def _want(case: TestCase) -> bytes:
    if case.call:
        import json

        return json.dumps(case.expected).encode()
    return expected_bytes(case.expected)


def _unscored(r: CaseResult, ended: str) -> CaseResult:
    verdict = Verdict.STARVED if ended == Ended.STARVED else Verdict.INFRASTRUCTURE
    return dataclasses.replace(r, verdict=verdict, detail="the checker could not run")
