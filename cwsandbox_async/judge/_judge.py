"""The judge: compile a completion once, run it against its test cases in one exec, compare in the driver.

``Judge(session)`` judges in a fresh sandbox of the session per completion (or a pool's lease, with
``pool=``, or the sandbox you pass). Per completion, one exclusive exec runs the in-sandbox runner
(``sandboxed/runner.py``): it writes the source into a fresh directory with an unguessable name,
compiles it under the language's own compile time limit, runs each case as a fresh process with
the case's CPU, wall and memory limits, reports each case's stdout (capped), stderr tail, exit,
CPU, wall and peak memory, and, once every process of the completion is dead, removes that
directory and everything the program created or changed in the sandbox's writable places
(``sandboxed/sweep.py``; a follow-up exec does it if the program killed the runner first). So a
sandbox is as it was before the completion when the next one is judged in it (a pool's reused
lease, or the sandbox you pass); ``JudgeResult.clean`` says when that could not be done, and a
judge that leased the sandbox from its pool then stops it instead of returning it.

The comparison with the expected output happens here, in the driver: expected outputs never enter
the sandbox (except for a ``Checker``, which runs after the program's exec and its sweep).

Failures are scored by who caused them (``docs/judge.md``): the program's (compile error, wrong
answer, time, memory, crash, killing the runner) are verdicts; the platform's (a sandbox that died
for outside reasons, a broken transport, a case starved of CPU twice) are ``INFRASTRUCTURE`` /
``STARVED`` and make the score ``None``; a caller mistake (unknown language, bad cases, a missing
toolchain: ``ToolchainError``, a checker that does not compile: ``JudgeError``, found before the
program runs) is raised.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

import anyio

from .._errors import SandboxValidationError
from ._cases import CaseDecider, stop_at_first_failure, timed_out, unreported
from ._checker import Checker, check_checker, run_checker
from ._compare import COMPARE_MODES, DEFAULT_TOL
from ._languages import Language, get_language
from ._plan import CACHE_DIR, Plan, budget_seconds, make_plan, output_cap
from ._problem import Problem
from ._reasons import compile_reason, result_reason
from ._runjob import SWEEP_SLACK_SECONDS, Ended, JobReport, RawCase, run_job
from ._toolchains import ToolchainCache
from ._types import SCORE_MODES, CaseResult, JudgeResult, Limits, TestCase, Verdict
from ._verdicts import score, summary_verdict, suspect_starved, tail

if TYPE_CHECKING:
    from .._sandbox import Sandbox
    from .._session import Session
    from ..pool import SandboxPool

__all__ = ["CACHE_DIR", "Judge"]

_TOOLCHAINS = ToolchainCache()
#: Memory the runner and a case's own overhead need in the sandbox beyond the case's limit.
ROOM_MIB = 64


class Judge:
    """Judges completions against test cases. See the module docstring and ``docs/judge.md``.

    - ``compare``: ``"whitespace"`` (default), ``"exact"``, ``"float"`` (``rel_tol``/``abs_tol``),
      or a ``Checker``.
    - ``score``: ``"fraction"`` (cases passed / cases), ``"all"`` (1.0 only if every case
      passed; the runner stops at the first case that crashes or runs out of time or memory, and
      the cases after it are ``SKIPPED``), ``"first_failure"`` (as ``"all"``, and the cases after
      a wrong answer are ``SKIPPED`` too).
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
        self._checker_ok = False
        self._checker_lock = anyio.Lock()

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

    async def _check_checker(self, sb: Sandbox) -> None:
        """Compile the checker once, in this sandbox before the program runs: ``JudgeError`` if it does not."""
        assert isinstance(self.compare, Checker)
        async with self._checker_lock:
            if not self._checker_ok:
                self._checker_ok = await check_checker(self.compare, sb, self)

    def budget_seconds(self, cases: int, language: str | Language, limits: Limits | None = None) -> float:
        """The longest judging ``cases`` test cases in ``language`` can take, every exec at its timeout."""
        checker = self.compare if isinstance(self.compare, Checker) else None
        return budget_seconds(get_language(language), limits or self.limits, cases, checker, self.starved_retries)

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
        cannot start or the checker does not compile (both before the program runs); everything
        the program does is a verdict, and the platform's failures make ``score`` ``None``.
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
            check_room(sb, lang, lim)
            await self._toolchain(lang, sb)
            if isinstance(self.compare, Checker):
                await self._check_checker(sb)
            result = await self._judge_in(sb, source, lang, cases, lim, fn_name if call else None)
            if not result.clean and sandbox is None:
                await sb.stop()  # never back to the pool with the completion's files in it
        self._record(result)
        return result

    def _record(self, result: JudgeResult) -> None:
        recorder = self.session.metrics.judge_verdict
        recorder("completions", 1)
        recorder(f"completion_{result.verdict.value}", 1)
        for kind, n in result.counts().items():
            recorder(kind, n)

    async def _judge_in(
        self, sb: Sandbox, source: str, lang: Language, cases: list[TestCase], lim: Limits, fn_name: str | None
    ) -> JudgeResult:
        checker = isinstance(self.compare, Checker)
        plan = make_plan(sb, source, lang, lim, fn_name=fn_name, output_bytes=output_cap(cases, lim, checker=checker))
        report = await self._run(sb, plan, [[c.stdin_bytes()] for c in cases])
        clean = report.clean is not False
        compiled = report.compile
        if plan.compile_step is not None and (compiled is None or compiled.exit_code != 0 or compiled.killed):
            result = await self._compile_failed(sb, plan, lang, cases, report)
            return dataclasses.replace(result, clean=result.clean and clean)
        results, rerun_clean = await self._case_results(sb, plan, cases, report, lang)
        if isinstance(self.compare, Checker):
            outputs = {r.index: r.stdout for r in report.cases}
            results, checker_clean = await run_checker(self.compare, sb, cases, results, outputs, self)
            clean = clean and checker_clean
        del report  # the cases' outputs were compared: only the results' excerpts stay
        if self.score_mode == "first_failure":
            results = stop_at_first_failure(results)
        verdict = summary_verdict(results)
        return JudgeResult(
            language=lang.name,
            verdict=verdict,
            score=score(results, self.score_mode, len(cases)),
            cases=tuple(results),
            compile_output=tail(compiled.stderr + compiled.stdout) if compiled else "",
            compile_seconds=compiled.wall_seconds if compiled else 0.0,
            reason=result_reason(verdict, results),
            clean=clean and rerun_clean,
        )

    async def _run(
        self,
        sb: Sandbox,
        plan: Plan,
        inputs: list[list[bytes]],
        *,
        exec_timeout: float | None = None,
        priority_cpu: float | None = None,
    ) -> JobReport:
        return await run_job(
            sb,
            step=plan.step,
            inputs=inputs,
            compile_step=plan.compile_step,
            mkdirs=plan.mkdirs,
            write=plan.writes,
            stop_on_failure=self.score_mode in ("all", "first_failure"),
            exec_timeout_seconds=exec_timeout,
            remove=[plan.work],
            priority_cpu_seconds=priority_cpu,
        )

    async def _compile_failed(
        self, sb: Sandbox, plan: Plan, lang: Language, cases: list[TestCase], report: JobReport
    ) -> JudgeResult:
        compiled = report.compile
        verdict, detail, output, clean = Verdict.COMPILE_ERROR, "", "", True
        assert plan.compile_step is not None
        if compiled is None:  # the runner never reported the compile: how did the exec end?
            verdict = {Ended.STARVED: Verdict.STARVED, Ended.INFRASTRUCTURE: Verdict.INFRASTRUCTURE}.get(
                report.ended, Verdict.COMPILE_ERROR
            )
            detail = report.detail or "the compile did not finish"
        else:
            output = tail(compiled.stderr + compiled.stdout)
            if suspect_starved(compiled):
                verdict, detail, clean = await self._recompile(sb, plan)
            elif compiled.killed in ("time", "wall"):
                detail = f"compile time limit exceeded ({plan.compile_step.time_seconds:g} s)"
            elif compiled.killed == "output":
                detail = "the compiler's output limit was exceeded"
            else:
                detail = compile_reason(output, plan.work)
        results = tuple(CaseResult(i, c.name, verdict, detail=detail) for i, c in enumerate(cases))
        return JudgeResult(
            language=lang.name,
            verdict=verdict,
            score=None if verdict.not_scored else 0.0,
            cases=results,
            compile_output=output.replace(f"{plan.work}/", ""),
            compile_seconds=compiled.wall_seconds if compiled else 0.0,
            reason=result_reason(verdict, results, detail if verdict is Verdict.COMPILE_ERROR else ""),
            clean=clean,
        )

    async def _recompile(self, sb: Sandbox, plan: Plan) -> tuple[Verdict, str, bool]:
        """A compile that ran out of wall time while starved: the sandbox decides, compiling alone."""
        assert plan.compile_step is not None
        priority = plan.compile_step.time_seconds + SWEEP_SLACK_SECONDS  # the compile's CPU, with priority
        wall = plan.compile_step.wall_seconds + 10.0
        report = await self._run(sb, plan, [], exec_timeout=wall, priority_cpu=priority)
        clean = report.clean is not False
        compiled = report.compile
        if compiled is None:
            if report.ended in (Ended.STARVED, Ended.INFRASTRUCTURE):
                return Verdict.STARVED, "the compile was starved of CPU twice", clean
            return Verdict.COMPILE_ERROR, "compile time limit exceeded", clean
        if compiled.exit_code != 0 or compiled.killed:
            why = tail(compiled.stderr + compiled.stdout)
            reason = compile_reason(why, plan.work) if why else "compile time limit exceeded"
            return Verdict.COMPILE_ERROR, reason, clean
        # It compiled when given the CPU: the judgement cannot go on from here without a rerun.
        return Verdict.STARVED, "the compile was starved of CPU (it succeeded when run alone)", clean

    async def _case_results(
        self, sb: Sandbox, plan: Plan, cases: list[TestCase], report: JobReport, lang: Language
    ) -> tuple[list[CaseResult], bool]:
        decide = CaseDecider(self.compare, self.rel_tol, self.abs_tol, plan.step, lang, report.oom_killed)
        raw = {r.index: r for r in report.cases}
        results: list[CaseResult] = []
        first_missing, clean = True, True
        for i, case in enumerate(cases):
            r = raw.get(i)
            if r is None:
                results.append(unreported(i, case, report, first_missing))
                first_missing = False
                continue
            if suspect_starved(r):
                again, why, rerun_clean = await self._rerun(sb, plan, case, r)
                clean = clean and rerun_clean
                if again is None:
                    detail = "its time ran out while it was starved of CPU, twice" + (f"; alone: {why}" if why else "")
                    results.append(CaseResult(i, case.name, Verdict.STARVED, detail=detail))
                    continue
                r = again
            results.append(decide(i, case, r))
        return results, clean

    async def _rerun(self, sb: Sandbox, plan: Plan, case: TestCase, first: RawCase) -> tuple[RawCase | None, str, bool]:
        """Run a case whose wall time ran out while it waited for a CPU again, alone (compiled afresh, in
        its own exec): ``None`` when starved again, with the sandbox's words for it; and whether the
        exec's sweep left the sandbox clean.

        Its wall budget is ``RERUN_WALL_FACTOR`` times the usual, so a busy program reaches its CPU
        limit (a certain time limit) even on a loaded machine; the exec's own timeout is its wall
        limit, so the sandbox, on evidence from outside the program, decides whether it was starved.
        """
        alone = dataclasses.replace(plan, step=dataclasses.replace(plan.step, wall_seconds=plan.rerun_seconds() * 10))
        # with CPU priority over the other sandboxes (where the backend can), within what the re-run may use:
        # its compile, its case's CPU limit with a margin, the runner's start and sweep
        compile_cpu = plan.compile_step.time_seconds if plan.compile_step is not None else 0.0
        priority = compile_cpu + 1.5 * plan.step.time_seconds + SWEEP_SLACK_SECONDS
        why, clean = "", True
        for _ in range(self.starved_retries):
            inputs = [[case.stdin_bytes()]]
            report = await self._run(sb, alone, inputs, exec_timeout=plan.rerun_seconds(), priority_cpu=priority)
            clean = clean and report.clean is not False
            if report.cases:
                return report.cases[0], "", clean
            if report.ended != Ended.STARVED:
                return timed_out(first), "", clean
            why = report.detail
        return None, why, clean


def check_room(sb: Sandbox, lang: Language, lim: Limits) -> None:
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
