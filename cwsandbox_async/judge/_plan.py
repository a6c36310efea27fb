"""One completion's job in its sandbox: its private directory, files, compile and run steps, and time budget.

Every exec of a completion (its judging, a starved case's rerun, a starved compile's retry) is
self-contained: it writes the source into a fresh directory with an unguessable name
(``<working dir>/.judge-<32 hex>``), compiles, runs, and the runner's sweep removes that directory
and everything the program wrote before the exec ends (``_runjob``), so nothing of one completion
is on disk when the next one starts in the same sandbox.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._callvalue import encode
from ._compare import expected_bytes
from ._languages import Language, get_language
from ._runjob import FOLLOW_UP_SWEEP_SECONDS, HARNESS_SOURCE, RUNNER_SLACK_SECONDS, SWEEP_SLACK_SECONDS, Step
from ._toolchains import VERSION_TIMEOUT_SECONDS, fill
from ._types import Limits, TestCase

if TYPE_CHECKING:
    from .._sandbox import Sandbox
    from ._checker import Checker

__all__ = ["CACHE_DIR", "OUTPUT_SLACK_BYTES", "Plan", "budget_seconds", "make_plan", "output_cap"]

#: Per-sandbox cache (Go's build cache), kept across the judgements of one sandbox (written only by compiles).
CACHE_DIR = "/tmp/cwsandbox-judge-cache"
#: The compile step's wall limit, as a multiple of its CPU limit (``compile_seconds``).
COMPILE_WALL_FACTOR = 1.5
#: A case suspected of being starved is re-run alone with this many times its wall limit.
RERUN_WALL_FACTOR = 4.0
#: A checker's wall limit per case (``time_seconds`` times this, plus 1 s) and its compile limit
#: (its language's ``compile_seconds`` times this).
CHECKER_WALL_FACTOR = 2.0
CHECKER_COMPILE_FACTOR = 2.0
#: Output kept beyond twice the expected output, for the built-in comparisons.
OUTPUT_SLACK_BYTES = 4096
_MIB = 1024 * 1024
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True, slots=True)
class Plan:
    """What one exec of a completion needs: its directory, files, steps."""

    work: str
    step: Step
    compile_step: Step | None
    writes: dict[str, bytes]
    mkdirs: list[str]

    def rerun_seconds(self) -> float:
        """The exec timeout of one case re-run alone (compile and sweep included: the exec starts afresh)."""
        compile_wall = self.compile_step.wall_seconds if self.compile_step is not None else 0.0
        step = self.step
        return step.wall_seconds * RERUN_WALL_FACTOR + 1.0 + compile_wall + step.time_seconds + SWEEP_SLACK_SECONDS


def uses_cache(lang: Language) -> bool:
    texts = [*(lang.compile or ()), *lang.run, *lang.env.values()]
    return any("{cache}" in t for t in texts)


def make_plan(
    sb: Sandbox,
    source: str,
    lang: Language,
    lim: Limits,
    *,
    fn_name: str | None,
    output_bytes: int,
    prefix: str = ".judge",
) -> Plan:
    """The job of ``source`` in a fresh directory of ``sb``'s working directory."""
    base = sb.defaults.working_dir.rstrip("/") or "/tmp"
    work = f"{base}/{prefix}-{uuid.uuid4().hex}"
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
    env = {**{"PATH": _PATH, "LANG": "C.UTF-8"}, **dict(sb.defaults.env), **env}
    writes = {src: source.encode("utf-8", "surrogatepass")}
    run = fill(lang.run, values)
    if fn_name is not None:
        writes[f"{work}/call_harness.py"] = HARNESS_SOURCE.encode()
        run = ["python3", "-I", f"{work}/call_harness.py", src, fn_name]
    time_limit = lim.time_seconds + lang.time_extra_seconds
    step = Step(
        argv=run,
        cwd=work,
        env=env,
        time_seconds=time_limit,
        wall_seconds=time_limit * lim.wall_factor + lim.wall_extra_seconds,
        memory_bytes=(lim.memory_mib + lang.memory_extra_mib) * _MIB,
        output_bytes=output_bytes,
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
    mkdirs = [work, f"{work}/home", f"{work}/gopath"] + ([CACHE_DIR] if uses_cache(lang) else [])
    return Plan(work, step, compile_step, writes, mkdirs)


def _expected_size(case: TestCase) -> int | None:
    """The expected output's size in bytes (a call's value: its token line), ``None`` when it cannot be told."""
    if not case.call:
        return len(expected_bytes(case.expected))
    try:
        return len(encode(case.expected))
    except TypeError:
        return None


def output_cap(cases: list[TestCase], lim: Limits, *, checker: bool) -> int:
    """Stdout kept per case: twice the largest expected output plus ``OUTPUT_SLACK_BYTES`` for the
    built-in comparisons (a longer output cannot match, unless by that much trailing whitespace);
    for a checker, which may accept another answer, at least ``Limits.output_mib``."""
    sizes = [_expected_size(c) for c in cases]
    if any(s is None for s in sizes):
        return int(lim.output_mib * _MIB)
    largest = max((s for s in sizes if s is not None), default=0)
    cap = 2 * largest + OUTPUT_SLACK_BYTES
    return max(cap, int(lim.output_mib * _MIB)) if checker else cap


def _job_seconds(time_limit: float, wall: float, cases: int, compile_wall: float) -> float:
    """As ``job_seconds`` (sweep included), from the limits alone."""
    return RUNNER_SLACK_SECONDS + cases * (wall + 0.5) + compile_wall + SWEEP_SLACK_SECONDS + cases * time_limit


def budget_seconds(lang: Language, lim: Limits, cases: int, checker: Checker | None, starved_retries: int = 1) -> float:
    """The longest one judgement can take, every exec at its timeout: the toolchain check, the job
    (compile, every case at its wall limit, the sweep), its follow-up sweep, every case re-run
    ``starved_retries`` times (each case may be suspected of starving), and for a checker its own
    check, job and reruns. ``code_reward``'s item deadline: a bound for a hung backend (every exec
    has its own timeout), far above a judgement's usual time."""
    time_limit = lim.time_seconds + lang.time_extra_seconds
    wall = time_limit * lim.wall_factor + lim.wall_extra_seconds
    compile_wall = lang.compile_seconds * COMPILE_WALL_FACTOR + 1.0 if lang.compile is not None else 0.0
    rerun = wall * RERUN_WALL_FACTOR + 1.0 + compile_wall + time_limit + SWEEP_SLACK_SECONDS
    total = VERSION_TIMEOUT_SECONDS + _job_seconds(time_limit, wall, cases, compile_wall)
    total += FOLLOW_UP_SWEEP_SECONDS + cases * starved_retries * rerun
    if checker is not None:
        clang = get_language(checker.language)
        c_wall = checker.time_seconds * CHECKER_WALL_FACTOR + 1.0
        c_compile = clang.compile_seconds * CHECKER_COMPILE_FACTOR if clang.compile is not None else 0.0
        check = _job_seconds(checker.time_seconds, c_wall, 0, c_compile) + FOLLOW_UP_SWEEP_SECONDS
        job = _job_seconds(checker.time_seconds, c_wall, cases, c_compile) + FOLLOW_UP_SWEEP_SECONDS
        c_rerun = c_wall + 1.0 + c_compile + SWEEP_SLACK_SECONDS
        total += VERSION_TIMEOUT_SECONDS + check + job + cases * c_rerun
    return total
