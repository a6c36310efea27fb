"""The judge: compile a completion once, run it against its test cases in one exec, compare in the driver.

``Judge(session)`` judges in a fresh sandbox of the session per completion (or a pool's lease, with
``pool=``, or the sandbox you pass). Per completion, one exclusive exec runs the in-sandbox runner
(``sandboxed/runner.py``): it writes the source, compiles it under the language's own compile time
limit, then runs each case as a fresh process with the case's CPU, wall and memory limits, and
reports each case's stdout (capped), stderr tail, exit, CPU, wall and peak memory. The comparison
with the expected output happens here, in the driver: expected outputs never enter the sandbox
(except for a ``Checker``, which runs after every process of the completion is gone).

Failures are scored by who caused them (``docs/judge.md``): the program's (compile error, wrong
answer, time, memory, crash, killing the runner) are verdicts; the platform's (a sandbox that died
for outside reasons, a broken transport, a case starved of CPU twice) are ``INFRASTRUCTURE`` /
``STARVED`` and make the score ``None``; a caller mistake (unknown language, bad cases, a missing
toolchain: ``ToolchainError``, found before any scoring) is raised.
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from .._errors import SandboxTimeoutError, SandboxValidationError
from ._checker import Checker, run_checker
from ._compare import COMPARE_MODES, DEFAULT_TOL, compare_call, compare_text, expected_bytes
from ._languages import Language, get_language
from ._problem import Problem
from ._runjob import HARNESS_SOURCE, Ended, JobReport, RawCase, Step, run_job
from ._toolchains import ToolchainCache, fill
from ._types import SCORE_MODES, CaseResult, JudgeResult, Limits, TestCase, Verdict
from ._verdicts import classify, score, summary_verdict, suspect_starved, tail

if TYPE_CHECKING:
    from .._sandbox import Sandbox
    from .._session import Session
    from ..pool import SandboxPool

__all__ = ["CACHE_DIR", "Judge"]

#: Per-sandbox cache (Go's build cache), kept across the judgements of one sandbox.
CACHE_DIR = "/tmp/cwsandbox-judge-cache"
_TOOLCHAINS = ToolchainCache()
#: The compile step's wall limit, as a multiple of its CPU limit (``compile_seconds``).
COMPILE_WALL_FACTOR = 1.5
#: A case suspected of being starved is re-run alone with this many times its wall limit.
RERUN_WALL_FACTOR = 4.0
_MIB = 1024 * 1024


class Judge:
    """Judges completions against test cases. See the module docstring and ``docs/judge.md``.

    - ``compare``: ``"whitespace"`` (default), ``"exact"``, ``"float"`` (``rel_tol``/``abs_tol``),
      or a ``Checker``.
    - ``score``: ``"fraction"`` (cases passed / cases), ``"all"`` (1.0 only if every case
      passed), ``"first_failure"`` (all-or-nothing, and judging stops at the first failing case;
      the cases after it are ``SKIPPED``).
    - ``limits``: per-case limits (``Limits``); a judgement may pass its own.
    - ``pool``: lease sandboxes from this pool instead of creating one per completion.
    - ``starved_retries``: how often a case whose time ran out while it was starved of CPU is
      re-run alone before it is ``STARVED``.

    Verdict counts go to the session's metrics (``cwsandbox/judge_<verdict>``, per case, and
    ``judge_completions``). Raises ``SandboxValidationError`` for bad settings.
    """

    def __init__(
        self,
        session: Session,
        *,
        compare: str | Checker = "whitespace",
        score: str = "fraction",
        limits: Limits | None = None,
        pool: SandboxPool | None = None,
        rel_tol: float = DEFAULT_TOL,
        abs_tol: float = DEFAULT_TOL,
        starved_retries: int = 1,
    ) -> None:
        if not isinstance(compare, Checker) and compare not in COMPARE_MODES:
            raise SandboxValidationError(f"compare must be one of {', '.join(COMPARE_MODES)} or a Checker")
        if score not in SCORE_MODES:
            raise SandboxValidationError(f"score must be one of {', '.join(SCORE_MODES)}, got {score!r}")
        if limits is not None and not isinstance(limits, Limits):
            raise SandboxValidationError("limits must be a Limits")
        if isinstance(starved_retries, bool) or not isinstance(starved_retries, int) or starved_retries < 0:
            raise SandboxValidationError("starved_retries must be an int >= 0")
        self.session = session
        self.compare = compare
        self.score_mode = score
        self.limits = limits or Limits()
        self.pool = pool
        self.rel_tol, self.abs_tol = float(rel_tol), float(abs_tol)
        self.starved_retries = starved_retries

    # -- sandboxes ---------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _sandbox(self, given: Sandbox | None) -> AsyncIterator[Sandbox]:
        if given is not None:
            yield given
        elif self.pool is not None:
            async with self.pool.lease() as sb:
                yield sb
        else:
            async with self.session.sandbox() as sb:
                yield sb

    async def check_toolchains(
        self, languages: Sequence[str | Language], *, sandbox: Sandbox | None = None
    ) -> dict[str, str]:
        """Each language's toolchain version; ``ToolchainError`` for the first one missing or broken.

        Checked once per session and language (cached); ``judge`` calls it too, so calling it
        first only moves the error to before the training starts.
        """
        langs = [get_language(lang) for lang in languages]
        out: dict[str, str] = {}
        missing = [lang for lang in langs if _TOOLCHAINS.known(self.session, lang) is None]
        async with contextlib.AsyncExitStack() as stack:
            sb = sandbox
            for lang in langs:
                if lang in missing and sb is None:
                    sb = await stack.enter_async_context(self._sandbox(None))
                out[lang.name] = await self._toolchain(lang, sb)
        return out

    async def _toolchain(self, lang: Language, sandbox: Sandbox | None) -> str:
        known = _TOOLCHAINS.known(self.session, lang)
        if isinstance(known, str):
            return known
        if known is not None:
            raise known
        assert sandbox is not None
        values = {"dir": "/tmp/cwsandbox-judge-version", "cache": CACHE_DIR}
        return await _TOOLCHAINS.check(self.session, sandbox, lang, values)

    # -- judging -----------------------------------------------------------------------
    async def judge(
        self,
        source: str,
        language: str | Language,
        cases: Sequence[TestCase] | Problem,
        *,
        sandbox: Sandbox | None = None,
        limits: Limits | None = None,
        fn_name: str | None = None,
    ) -> JudgeResult:
        """Judge one completion (``source`` in ``language``) against ``cases``; see the class docstring.

        ``cases`` may be a ``Problem`` (from the dataset adapters), which brings its ``fn_name``
        for call-based cases (Python only). Raises ``SandboxValidationError`` for bad input,
        ``ToolchainError`` when the language's toolchain is missing, ``JudgeError`` when the runner
        cannot start; everything the program does is a verdict, and the platform's failures make
        ``score`` ``None``.
        """
        lang = get_language(language)
        if isinstance(cases, Problem):
            fn_name = fn_name or cases.fn_name
            cases = cases.cases
        if not isinstance(source, str):
            raise SandboxValidationError("source must be a str")
        cases = list(cases)
        if not all(isinstance(c, TestCase) for c in cases):
            raise SandboxValidationError("cases must be TestCase objects (see the dataset adapters)")
        call = any(c.call for c in cases)
        if call and (lang.name != "python" or not fn_name):
            raise SandboxValidationError("call-based cases need language 'python' and an fn_name")
        lim = limits or self.limits
        async with self._sandbox(sandbox) as sb:
            _check_room(sb, lang, lim)
            await self._toolchain(lang, sb)
            result = await self._judge_in(sb, source, lang, cases, lim, fn_name if call else None)
        self._record(result)
        return result

    def _record(self, result: JudgeResult) -> None:
        recorder = self.session.metrics.judge_verdict
        recorder("completions", 1)
        recorder(f"completion_{result.verdict.value}", 1)
        for kind, n in result.counts().items():
            recorder(kind, n)

    def _steps(
        self, sb: Sandbox, source: str, lang: Language, lim: Limits, fn_name: str | None
    ) -> tuple[str, Step, Step | None, dict[str, bytes]]:
        base = sb.defaults.working_dir.rstrip("/") or "/tmp"
        work = f"{base}/.judge-{uuid.uuid4().hex[:12]}"
        cls = lang.class_name(source)
        src = f"{work}/{lang.source_file.replace('{class}', cls)}"
        values = {
            "dir": work,
            "src": src,
            "exe": f"{work}/main",
            "class": cls,
            "cache": CACHE_DIR,
            "memory_mib": str(lim.memory_mib),
        }
        env = {k: fill((v,), values)[0] for k, v in lang.env.items()}
        env = {
            **{"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"},
            **dict(sb.defaults.env),
            **env,
        }
        writes = {src: source.encode("utf-8", "surrogatepass")}
        run = fill(lang.run, values)
        if fn_name is not None:
            writes[f"{work}/call_harness.py"] = HARNESS_SOURCE.encode()
            run = ["python3", "-I", f"{work}/call_harness.py", src, fn_name]
        time_limit = lim.time_seconds + lang.time_extra_seconds
        memory = (lim.memory_mib + lang.memory_extra_mib) * _MIB
        step = Step(
            argv=run,
            cwd=work,
            env=env,
            time_seconds=time_limit,
            wall_seconds=time_limit * lim.wall_factor + lim.wall_extra_seconds,
            memory_bytes=memory,
            output_bytes=int(lim.output_mib * _MIB),
            stderr_bytes=lim.stderr_bytes,
            sample_seconds=lim.sample_seconds,
        )
        compile_step = None
        if lang.compile is not None:
            compile_step = Step(
                argv=fill(lang.compile, values),
                cwd=work,
                env=env,
                time_seconds=lang.compile_seconds,
                wall_seconds=lang.compile_seconds * COMPILE_WALL_FACTOR + 1.0,
                memory_bytes=None,
                output_bytes=64 * 1024,
                stderr_bytes=8 * 1024,
            )
        return work, step, compile_step, writes

    async def _judge_in(
        self, sb: Sandbox, source: str, lang: Language, cases: list[TestCase], lim: Limits, fn_name: str | None
    ) -> JudgeResult:
        work, step, compile_step, writes = self._steps(sb, source, lang, lim, fn_name)
        expected_len = max((len(_expected_text(c)) for c in cases), default=0)
        step = _with_output(step, max(step.output_bytes, 2 * expected_len + 4096))
        mkdirs = [work, f"{work}/home", f"{work}/gopath", CACHE_DIR]
        report = await run_job(
            sb,
            step=step,
            inputs=[[c.stdin_bytes()] for c in cases],
            compile_step=compile_step,
            mkdirs=mkdirs,
            write=writes,
            stop_on_failure=self.score_mode == "first_failure",
        )
        compiled = report.compile
        compile_seconds = compiled.wall_seconds if compiled else 0.0
        if compile_step is not None and (compiled is None or compiled.exit_code != 0 or compiled.killed):
            return await self._compile_failed(sb, lang, cases, report, compile_step)
        results = await self._case_results(sb, step, cases, report, lang, fn_name)
        if isinstance(self.compare, Checker):
            outputs = {r.index: r.stdout for r in report.cases}
            results = await run_checker(self.compare, sb, cases, results, outputs, self)
        if self.score_mode == "first_failure":
            results = _stop_at_first_failure(results)
        return JudgeResult(
            language=lang.name,
            verdict=summary_verdict(results),
            score=score(results, self.score_mode, len(cases)),
            cases=tuple(results),
            compile_output=tail(compiled.stderr + compiled.stdout) if compiled else "",
            compile_seconds=compile_seconds,
        )

    async def _compile_failed(
        self, sb: Sandbox, lang: Language, cases: list[TestCase], report: JobReport, step: Step
    ) -> JudgeResult:
        compiled = report.compile
        verdict, detail, output = Verdict.COMPILE_ERROR, "", ""
        if compiled is None:  # the runner never reported the compile: how did the exec end?
            verdict = {Ended.STARVED: Verdict.STARVED, Ended.INFRASTRUCTURE: Verdict.INFRASTRUCTURE}.get(
                report.ended, Verdict.COMPILE_ERROR
            )
            detail = report.detail or "the compile did not finish"
        else:
            output = tail(compiled.stderr + compiled.stdout)
            if suspect_starved(compiled):
                verdict, detail = await self._recompile(sb, step)
            elif compiled.killed in ("time", "wall"):
                detail = f"compile time limit exceeded ({step.time_seconds:g} s)"
            elif compiled.killed == "output":
                detail = "the compiler's output limit was exceeded"
            else:
                detail = f"the compiler exited {compiled.exit_code}"
        results = tuple(CaseResult(i, c.name, verdict, detail=detail) for i, c in enumerate(cases))
        return JudgeResult(
            language=lang.name,
            verdict=verdict,
            score=None if verdict.not_scored else 0.0,
            cases=results,
            compile_output=output,
            compile_seconds=compiled.wall_seconds if compiled else 0.0,
        )

    async def _recompile(self, sb: Sandbox, step: Step) -> tuple[Verdict, str]:
        """A compile that ran out of wall time while starved: the sandbox decides, compiling alone."""
        try:
            result = await sb.exec(
                list(step.argv), cwd=step.cwd, env=dict(step.env), timeout_seconds=step.wall_seconds, exclusive=True
            )
        except SandboxTimeoutError as exc:
            if exc.infrastructure:
                return Verdict.STARVED, "the compile was starved of CPU twice"
            return Verdict.COMPILE_ERROR, "compile time limit exceeded"
        if result.returncode != 0:
            return Verdict.COMPILE_ERROR, f"the compiler exited {result.returncode}"
        # It compiled when given the CPU: the judgement cannot go on from here without a rerun.
        return Verdict.STARVED, "the compile was starved of CPU (it succeeded when run alone)"

    async def _case_results(
        self, sb: Sandbox, step: Step, cases: list[TestCase], report: JobReport, lang: Language, fn_name: str | None
    ) -> list[CaseResult]:
        raw = {r.index: r for r in report.cases}
        results: list[CaseResult] = []
        first_missing = True
        for i, case in enumerate(cases):
            r = raw.get(i)
            if r is None:
                results.append(_unreported(i, case, report, first_missing))
                first_missing = False
                continue
            if suspect_starved(r):
                r, why = await self._rerun(sb, step, case, r)
                if r is None:
                    detail = "its time ran out while it was starved of CPU, twice" + (f"; alone: {why}" if why else "")
                    results.append(CaseResult(i, case.name, Verdict.STARVED, detail=detail))
                    continue
            results.append(self._verdict(i, case, r, step, lang, report.oom_killed))
        return results

    async def _rerun(self, sb: Sandbox, step: Step, case: TestCase, first: RawCase) -> tuple[RawCase | None, str]:
        """Run a case whose wall time ran out while it waited for a CPU again, alone: ``None`` when starved
        again, with the sandbox's words for it (what CPU it got, how long it waited).

        Its wall budget is ``RERUN_WALL_FACTOR`` times the usual, so a busy program reaches its CPU
        limit (a certain time limit) even on a loaded machine; the exec's own timeout is its wall
        limit, so the sandbox, on evidence from outside the program, decides whether it was starved.
        """
        budget = step.wall_seconds * RERUN_WALL_FACTOR
        alone = dataclasses.replace(step, wall_seconds=budget * 10)
        why = ""
        for _ in range(self.starved_retries):
            report = await run_job(sb, step=alone, inputs=[[case.stdin_bytes()]], exec_timeout_seconds=budget + 1.0)
            if report.cases:
                return report.cases[0], ""
            if report.ended != Ended.STARVED:
                return _timed_out(first), ""
            why = report.detail
        return None, why

    def _verdict(self, i: int, case: TestCase, r: RawCase, step: Step, lang: Language, exec_oom: bool) -> CaseResult:
        facts: dict[str, Any] = {
            "exit_code": r.exit_code,
            "cpu_seconds": r.cpu_seconds,
            "wall_seconds": r.wall_seconds,
            "memory_bytes": r.memory_bytes,
            "stdout": tail(r.stdout, 2000),
            "stderr_tail": tail(r.stderr, 2000),
        }
        decided = classify(
            r,
            time_seconds=step.time_seconds,
            memory_bytes=step.memory_bytes,
            oom_markers=lang.oom_markers,
            exec_oom=exec_oom,
        )
        if decided is not None:
            return CaseResult(i, case.name, decided[0], detail=decided[1], **facts)
        if isinstance(self.compare, Checker):
            return CaseResult(i, case.name, Verdict.ACCEPTED, detail="to be checked", **facts)
        mode = self.compare
        if case.call:
            ok = compare_call(mode, r.stdout, case.expected, rel_tol=self.rel_tol, abs_tol=self.abs_tol)
        else:
            ok = compare_text(mode, r.stdout, expected_bytes(case.expected), rel_tol=self.rel_tol, abs_tol=self.abs_tol)
        return CaseResult(i, case.name, Verdict.ACCEPTED if ok else Verdict.WRONG_ANSWER, **facts)


#: Memory the runner and a case's own overhead need in the sandbox beyond the case's limit.
ROOM_MIB = 64


def _check_room(sb: Sandbox, lang: Language, lim: Limits) -> None:
    """``SandboxValidationError`` when the sandbox's own limits leave no room for the case's."""
    res = sb.defaults.resources
    need = lim.memory_mib + lang.memory_extra_mib + ROOM_MIB
    if res.memory_mib is not None and res.memory_mib < need:
        raise SandboxValidationError(
            f"the sandbox's memory limit ({res.memory_mib} MiB) must be at least the case's limit plus "
            f"{lang.memory_extra_mib + ROOM_MIB} MiB ({need} MiB) for {lang.name}"
        )
    if res.pids is not None and res.pids < lang.min_pids:
        raise SandboxValidationError(f"{lang.name} needs Resources.pids >= {lang.min_pids}, the sandbox has {res.pids}")


def _expected_text(case: TestCase) -> bytes:
    if case.call:
        return b""
    return expected_bytes(case.expected)


def _with_output(step: Step, output: int) -> Step:
    return dataclasses.replace(step, output_bytes=output)


def _timed_out(first: RawCase) -> RawCase:
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


def _unreported(i: int, case: TestCase, report: JobReport, first: bool) -> CaseResult:
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


def _stop_at_first_failure(results: list[CaseResult]) -> list[CaseResult]:
    out: list[CaseResult] = []
    failed = False
    for r in results:
        if failed:
            out.append(CaseResult(r.index, r.name, Verdict.SKIPPED, detail="not counted: an earlier case failed"))
            continue
        out.append(r)
        failed = not r.passed and not r.verdict.not_scored
    return out
