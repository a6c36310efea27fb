"""Checker programs: a problem's own judge of an output, run in the sandbox as its own process.

``Checker(source, language="python")`` is compiled (if its language compiles) and run once per case
that ended normally, as ``<run argv> input.txt output.txt expected.txt`` (testlib's order: the
case's input, the program's output, the expected answer) in a fresh directory with an unguessable
name. Exit 0 accepts; any other exit (testlib: 1 wrong answer, 2 presentation error), a crash or a
checker that runs out of time is a wrong answer (the program's output may be what broke it), with
the checker's output as the detail.

**Before the program.** The first judgement of a ``Judge`` compiles the checker once (``check_checker``)
in its sandbox before the program runs there: a checker that does not compile on a clean sandbox
raises ``JudgeError`` (the caller's to fix) before any score.

**After the program.** The checker runs in its own exclusive exec after the program's exec ended:
every process of the completion was killed, and everything it wrote was swept (``_runjob``), before
the checker is written, compiled or run, so nothing of the program can touch it; the expected
answers enter the sandbox only then, and the checker's exec sweeps its own directory (the expected
answers with it) before it ends. A checker step that fails now (its runner cannot start, it does
not compile) fails because of what the program did or left: the checked cases are the program's
``WRONG_ANSWER`` with that reason, never an exception. A checker whose time ran out while it was
starved of CPU is run again alone, then the case is ``STARVED``.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._errors import SandboxValidationError
from .._log import log
from ._callvalue import decode, encode
from ._compare import expected_bytes
from ._languages import Language, get_language
from ._plan import CACHE_DIR, CHECKER_COMPILE_FACTOR, CHECKER_WALL_FACTOR, uses_cache
from ._runjob import SWEEP_SLACK_SECONDS, Ended, JobReport, Step, run_job
from ._toolchains import fill
from ._types import CaseResult, JudgeError, TestCase, Verdict
from ._verdicts import suspect_starved, tail

if TYPE_CHECKING:
    from .._sandbox import Sandbox
    from ._judge import Judge

__all__ = ["Checker", "check_checker", "run_checker"]

FILES = ("input.txt", "output.txt", "expected.txt")
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


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


@dataclass(frozen=True, slots=True)
class _Job:
    work: str
    step: Step
    compile_step: Step | None
    mkdirs: list[str]
    write: dict[str, bytes]


def _job(checker: Checker, sb: Sandbox) -> _Job:
    lang = get_language(checker.language)
    base = sb.defaults.working_dir.rstrip("/") or "/tmp"
    work = f"{base}/.checker-{uuid.uuid4().hex}"
    cls = lang.class_name(checker.source)
    src = f"{work}/{lang.source_file.replace('{class}', cls)}"
    values = {"dir": work, "src": src, "exe": f"{work}/main", "class": cls, "cache": CACHE_DIR}
    values["memory_mib"] = str(checker.memory_mib)
    env = {"PATH": _PATH, "LANG": "C.UTF-8"}
    env.update({k: fill((v,), values)[0] for k, v in lang.env.items()})
    step = Step(
        argv=[*fill(lang.run, values), *FILES],
        cwd=work,
        env=env,
        time_seconds=checker.time_seconds,
        wall_seconds=checker.time_seconds * CHECKER_WALL_FACTOR + 1,
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
            wall_seconds=CHECKER_COMPILE_FACTOR * lang.compile_seconds,
        )
    mkdirs = [work, f"{work}/home"] + ([CACHE_DIR] if uses_cache(lang) else [])
    return _Job(work, step, compile_step, mkdirs, {src: checker.source.encode("utf-8", "surrogatepass")})


def _compile_failed(job: _Job, report: JobReport) -> bool:
    return job.compile_step is not None and (report.compile is None or report.compile.exit_code != 0)


async def check_checker(checker: Checker, sb: Sandbox, judge: Judge) -> bool:
    """Compile ``checker`` in ``sb`` (before a program runs there). ``JudgeError`` if it does not compile;
    ``False`` when the platform kept it from finishing (ask again next time), ``True`` when it compiled."""
    await judge.check_toolchains([checker.language], sandbox=sb)
    job = _job(checker, sb)
    report = await run_job(
        sb,
        step=job.step,
        inputs=[],
        compile_step=job.compile_step,
        mkdirs=job.mkdirs,
        write=job.write,
        remove=[job.work],
    )
    if not _compile_failed(job, report):
        return True
    if report.ended in (Ended.STARVED, Ended.INFRASTRUCTURE):
        return False
    why = tail(report.compile.stderr + report.compile.stdout) if report.compile else report.detail
    raise JudgeError(f"the checker does not compile: {why.replace(job.work + '/', '')}")


async def run_checker(
    checker: Checker,
    sb: Sandbox,
    cases: list[TestCase],
    results: list[CaseResult],
    outputs: dict[int, bytes],
    judge: Judge,
) -> tuple[list[CaseResult], bool]:
    """``results`` with every "to be checked" case decided by the checker; whether its exec left the sandbox clean."""
    todo = [r for r in results if r.verdict is Verdict.ACCEPTED]
    if not todo:
        return results, True
    job = _job(checker, sb)
    inputs = [
        [b"", cases[r.index].stdin_bytes(), _got(cases[r.index], outputs.get(r.index, b"")), _want(cases[r.index])]
        for r in todo
    ]
    try:
        report = await run_job(
            sb,
            step=job.step,
            inputs=inputs,
            compile_step=job.compile_step,
            mkdirs=job.mkdirs,
            write=job.write,
            files=FILES,
            remove=[job.work],
        )
    except JudgeError as exc:  # after the program ran: what it did or left broke the checker's start
        log.warning("the checker could not start after the program", error=exc.message)
        why = f"the checker could not run after the program: {exc.message[-200:]}"
        return [_failed(r, why, todo) for r in results], True
    clean = report.clean is not False
    if _compile_failed(job, report):
        if report.ended in (Ended.STARVED, Ended.INFRASTRUCTURE):
            return [_unscored(r, report.ended) if r in todo else r for r in results], clean
        why = tail(report.compile.stderr + report.compile.stdout, 200) if report.compile else report.detail
        return [_failed(r, f"the checker did not compile after the program: {why}", todo) for r in results], clean
    decided = {r.index: r for r in report.cases}
    out: list[CaseResult] = []
    for r in results:
        if r.verdict is not Verdict.ACCEPTED:
            out.append(r)
            continue
        k = todo.index(r)
        raw = decided.get(k)
        compile_wall = job.compile_step.wall_seconds if job.compile_step is not None else 0.0
        if raw is not None and suspect_starved(raw):
            again = await run_job(
                sb,
                step=job.step,
                inputs=[inputs[k]],
                compile_step=job.compile_step,
                mkdirs=job.mkdirs,
                write=job.write,
                files=FILES,
                exec_timeout_seconds=job.step.wall_seconds + 1 + compile_wall + SWEEP_SLACK_SECONDS,
                remove=[job.work],
            )
            clean = clean and again.clean is not False
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
    return out, clean


def _failed(r: CaseResult, why: str, todo: list[CaseResult]) -> CaseResult:
    return dataclasses.replace(r, verdict=Verdict.WRONG_ANSWER, detail=why) if r in todo else r


def _json(value: object) -> bytes | None:
    try:
        return json.dumps(value).encode()
    except (TypeError, ValueError, RecursionError):
        return None


def _got(case: TestCase, stdout: bytes) -> bytes:
    """What the checker reads as the program's output: a call's value as JSON when JSON can hold it."""
    if not case.call:
        return stdout
    try:
        value = decode(stdout.rstrip(b"\n").rpartition(b"\n")[2])
    except ValueError:
        return stdout
    if isinstance(value, (set, frozenset, tuple)):
        value = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else list(value)
    return _json(value) or stdout


def _want(case: TestCase) -> bytes:
    if case.call:
        return _json(case.expected) or encode(case.expected)
    return expected_bytes(case.expected)


def _unscored(r: CaseResult, ended: str) -> CaseResult:
    verdict = Verdict.STARVED if ended == Ended.STARVED else Verdict.INFRASTRUCTURE
    return dataclasses.replace(r, verdict=verdict, detail="the checker could not run")
