"""One completion's run: its program under the harness, the retries of a starved run, its verdict.

A wall timeout classed as **starved** (others held the CPUs: ``ExecResult.starved``) is
re-run up to ``starved_retries`` times in the same sandbox, each retry with its own
budget: ``timeout_seconds`` of **CPU time** (``cpu_seconds``), with **CPU priority** over
the other sandboxes (``cpu_priority``: the local backend raises the sandbox's CPU weight
while the retry runs), within a wall deadline of ``starved_retry_timeout_seconds``. So an
infinite loop that was starved gets its CPU time on the retry and ends as a ``timeout``
(0.0), and a correct but starved program passes. Only an item still starved after its
last retry is left unscored (``starved``, None): a retry starved even with priority, or
a backend that has none to give (no CPU cgroup) on a machine still too busy for it.

An item's whole wall time, retries and reports included, is at most ``wall_factor`` (10)
times its timeout: a retry's wall deadline is what that budget has left after one more
timeout (for the retry's report), when that is less than ``starved_retry_timeout_seconds``;
a retry with less than one timeout left is not run (``starved``); and a run still going
when the budget is spent is cut (``starved``: no verdict could be measured in it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import anyio

from .._errors import SandboxError, SandboxTimeoutError, SandboxValidationError
from .._log import log
from ._harness import harness_run
from ._run import programs_doing, run_python
from ._split import split_run
from ._verdicts import CompletionVerdict, VerdictKind, from_result

if TYPE_CHECKING:
    from .._sandbox import Sandbox
    from .._types import ExecResult
    from ._split import HarnessVerdict

__all__ = ["HARNESSES", "ItemSettings", "judge", "run_item", "run_item_with_result"]

#: The harnesses a reward can run its programs under (see docs/outcomes.md).
HARNESSES = ("split", "in_process")

#: The harnesses' kinds (``HarnessVerdict.kind``) as verdict kinds; ``tests_error`` is raised (``judge``).
_KINDS = {
    "passed": VerdictKind.PASSED,
    "wrong_answer": VerdictKind.WRONG_ANSWER,
    "error_exit": VerdictKind.ERROR_EXIT,
    "early_exit": VerdictKind.EARLY_EXIT,
    "compile_error": VerdictKind.COMPILE_ERROR,
}


class _Run(Protocol):
    @property
    def source(self) -> str: ...
    @property
    def stdin(self) -> bytes: ...
    def verdict(self, result: ExecResult) -> HarnessVerdict | None: ...


@dataclass(frozen=True, slots=True)
class ItemSettings:
    """What every item of one reward runs with (``wall_factor``: see the module docstring)."""

    timeout_seconds: float
    python: str
    harness: str = "split"
    starved_retries: int = 1
    starved_retry_timeout_seconds: float = 40.0
    wall_factor: float = 10.0


def judge(run: _Run, result: ExecResult) -> tuple[VerdictKind, str]:
    """The kind and reason (one line) of a finished (not timed-out) run, from the exec's facts and the harness.

    Raises ``SandboxValidationError`` when the harness reports that the tests do not compile
    (``tests_error``): the caller's mistake, raised after the batch like any other.
    """
    if result.oom_killed:
        return VerdictKind.OOM, "killed for its memory (out of memory)"
    if result.cpu_exceeded:
        return VerdictKind.CPU_BUDGET, f"exceeded its CPU budget ({result.cpu_seconds:.2f} s of CPU)"
    if result.truncated:
        return VerdictKind.ERROR_EXIT, "its output passed the output cap (the command was killed)"
    said = run.verdict(result)
    if said is None:
        how = f"was killed by signal {result.signal}" if result.signal else f"exited with code {result.returncode}"
        # Exit codes 2 and 3 are the harness's own, before any of the program ran (its note is on stderr).
        notes = [line for line in result.stderr.splitlines() if line.startswith("cwsandbox: ")]
        own = notes and result.returncode in (2, 3)
        why = f": {notes[-1][len('cwsandbox: ') :]}" if own else " (the program broke the harness)"
        return VerdictKind.ERROR_EXIT, f"the tests' process {how} before it reported a verdict{why}"
    reason = " ".join(said.reason.split())
    if said.kind == "tests_error":
        raise SandboxValidationError(f"the tests do not compile: {reason}")
    kind = _KINDS[said.kind]
    if kind is VerdictKind.PASSED and result.returncode != 0:
        return VerdictKind.ERROR_EXIT, f"exit code {result.returncode} after its tests passed"
    return kind, reason or ("its tests passed" if kind is VerdictKind.PASSED else str(kind))


async def run_item(
    sandbox: Sandbox, index: int, code: str, tests: str | None, settings: ItemSettings
) -> CompletionVerdict:
    """Run one program (see the module docstring) and return its verdict.

    Raises what the platform or the caller caused (an infrastructure error, a stopped
    sandbox, a bug); the program's own failures are verdicts.
    """
    return (await run_item_with_result(sandbox, index, code, tests, settings))[0]


async def run_item_with_result(
    sandbox: Sandbox, index: int, code: str, tests: str | None, settings: ItemSettings
) -> tuple[CompletionVerdict, ExecResult | None]:
    """``run_item``, with the last run's ``ExecResult`` (``None`` if it left none).

    Returns within ``settings.wall_factor`` times the timeout (the module docstring)."""
    retries = 0
    budget = settings.wall_factor * settings.timeout_seconds
    deadline = anyio.current_time() + budget
    timeout, cpu, priority = settings.timeout_seconds, None, False
    with anyio.move_on_after(budget):
        while True:
            run: _Run = split_run(code, tests) if settings.harness == "split" else harness_run(code, tests)
            try:
                result = await run_python(
                    sandbox,
                    run.source,
                    stdin=run.stdin,
                    timeout_seconds=timeout,
                    cpu_seconds=cpu,
                    python=settings.python,
                    exclusive=True,
                    cpu_priority=priority,
                    isolated=True,  # nothing an earlier command wrote (a sitecustomize.py) runs before the harness
                )
            except SandboxTimeoutError as exc:
                partial = exc.result
                if partial is not None and partial.starved:
                    # The retry's wall: what the item's budget has left after one more timeout for its report.
                    wall = min(
                        settings.starved_retry_timeout_seconds,
                        deadline - anyio.current_time() - settings.timeout_seconds,
                    )
                    if retries < settings.starved_retries and wall >= settings.timeout_seconds:
                        retries += 1
                        timeout, cpu, priority = wall, settings.timeout_seconds, True
                        log.debug("reward item starved, retrying", index=index, retry=retries, error=exc.message)
                        continue
                    return from_result(index, partial, VerdictKind.STARVED, exc.message, retries=retries), partial
                if not programs_doing(exc):
                    raise
                reason = f"ran past its timeout of {timeout:g} s"
                if partial is None:
                    return CompletionVerdict(index, VerdictKind.TIMEOUT, 0.0, reason, retries=retries), None
                return from_result(index, partial, VerdictKind.TIMEOUT, reason, retries=retries), partial
            except SandboxError as exc:
                if not programs_doing(exc):
                    raise  # the platform's failure (None), or a caller mistake or bug (raised after the batch)
                reason = f"the program took its sandbox down: {exc.message}"
                return CompletionVerdict(index, VerdictKind.ERROR_EXIT, 0.0, reason, retries=retries), None
            kind, reason = judge(run, result)
            if retries and kind is VerdictKind.CPU_BUDGET:
                kind = VerdictKind.TIMEOUT
                reason = f"used its {settings.timeout_seconds:g} s of CPU time on a retry (its first run was starved)"
            return from_result(index, result, kind, reason, retries=retries), result
    reason = (
        f"no verdict within the item's wall budget ({budget:g} s, {settings.wall_factor:g} x its timeout):"
        " the machine is overloaded"
    )
    log.warning("reward item cut at its wall budget", index=index, budget=budget, retries=retries)
    return CompletionVerdict(index, VerdictKind.STARVED, None, reason, retries=retries), None
