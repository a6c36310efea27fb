"""The scoring core behind the TRL reward functions: extract, run against the tests, 1.0 / 0.0 / None.

Each program runs under the test harness (``_harness``): 1.0 needs the tests to
have run to their end, so ending the process early scores 0.0. Outcomes map as:

- the program's own outcome is a score: it failed, ran past its timeout, was
  OOM-killed, exceeded its CPU budget, or took its own sandbox down (a
  ``SandboxError`` with ``infrastructure=False``): 0.0;
- the platform's failure is ``None`` ("not scored"), counted in
  ``infra_failures``: an infrastructure error, a wall timeout while the program
  was starved of CPU (also counted in ``starved``), the item deadline;
- a caller mistake or a bug (any other exception) is logged at ERROR and raised
  once the whole batch has finished, never turned into a score.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._errors import SandboxError, SandboxTimeoutError, SandboxValidationError
from .._log import log
from .._validate import validate_timeout
from ..gatherer._outcome import OutcomeKind
from ..judge._reward import JudgeItem, JudgeOptions, JudgeScoring
from ._extract import completion_text, extract_code
from ._harness import harness_run
from ._run import programs_doing, run_python

if TYPE_CHECKING:
    from .._sandbox import Sandbox
    from .._session import Session

__all__ = ["Extractor", "RewardCallStats", "RewardCore", "SandboxSource"]

#: Turns a completion's text into code, or ``None`` when it holds none.
Extractor = Callable[[str], "str | None"]
#: Hands out one sandbox per program: ``async with source() as sandbox``.
SandboxSource = Callable[[], AbstractAsyncContextManager["Sandbox"]]

#: Slack added to each item's deadline beyond lease wait + program timeout (exec grace, file transfer).
ITEM_DEADLINE_SLACK_SECONDS = 30.0
#: Outcome kinds that mean "the platform could not reach a verdict": ``None``, counted as infra failures.
_NOT_SCORED = frozenset({OutcomeKind.INFRA, OutcomeKind.STARVED, OutcomeKind.TIMEOUT, OutcomeKind.CANCELLED})


@dataclass(frozen=True, slots=True)
class RewardCallStats:
    """What one reward call did. ``sandboxes`` programs ran; ``skipped`` completions had no code;
    ``infra_failures`` got ``None`` because the platform failed (or missed its deadline), ``starved``
    of them because their wall timeout fired while they were starved of CPU; ``oom_killed``
    programs were killed for their memory (scored 0.0). ``step`` is TRL's ``trainer_state.global_step``
    during the call (completed steps); ``name`` the reward function's."""

    call: int
    sandboxes: int
    passed: int
    skipped: int
    infra_failures: int
    step: int | None
    starved: int = 0
    oom_killed: int = 0
    name: str = ""

    def line(self) -> str:
        """The familiar one-line summary, naming the reward (two in one trainer print different lines)."""
        named = f" ({self.name})" if self.name else ""
        text = (
            f"[CWSandbox] Reward call {self.call}{named}: {self.sandboxes} sandboxes, "
            f"{self.passed}/{self.sandboxes} passed, {self.skipped} skipped (no code)"
        )
        if self.infra_failures:
            text += f", {self.infra_failures} infra failures (not scored"
            text += f"; {self.starved} starved of CPU)" if self.starved else ")"
        if self.oom_killed:
            text += f", {self.oom_killed} out of memory"
        return text


@dataclass(frozen=True, slots=True)
class _Scored:
    """One program's verdict."""

    score: float
    oom_killed: bool


def _tests_for(kwargs: Mapping[str, Any], column: str | None, n: int) -> list[str | None]:
    if column is None:
        return [None] * n
    if column not in kwargs:
        cols = sorted(k for k in kwargs if k not in ("trainer_state", "log_extra", "log_metric", "environments"))
        raise SandboxValidationError(f"tests column {column!r} is not among the reward kwargs; got {cols}")
    values = kwargs[column]
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) != n:
        raise SandboxValidationError(f"reward kwarg {column!r} must be a list with one entry per completion ({n})")
    out: list[str | None] = []
    for value in values:
        if value is None or isinstance(value, str):
            out.append(value)
        elif isinstance(value, Sequence) and all(isinstance(v, str) for v in value):
            out.append("\n".join(value))
        else:
            raise SandboxValidationError(f"tests in {column!r} must be str, a list of str, or None")
    return out


class RewardCore:
    """Settings and the scoring of one batch; shared by the async and sync reward functions."""

    def __init__(
        self,
        *,
        extractor: Extractor | None,
        tests_column: str | None,
        timeout_seconds: float,
        limit: int,
        lease_timeout_seconds: float,
        python: str,
        verbose: bool,
        name: str = "",
        judge: JudgeOptions | None = None,
    ) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise SandboxValidationError(f"limit must be a positive int, got {limit!r}")
        if extractor is not None and not callable(extractor):
            raise SandboxValidationError("extractor must be a callable str -> str | None")
        self.extractor: Extractor = extractor or extract_code
        self.tests_column = tests_column
        self.timeout_seconds = validate_timeout(timeout_seconds) or 0.0
        self.lease_timeout_seconds = validate_timeout(lease_timeout_seconds, "lease_timeout_seconds") or 0.0
        self.limit = limit
        self.python = python
        self.verbose = verbose
        self.name = name
        #: With ``judge``, completions are judged against the row's test cases (``judge._reward``).
        self.judging = JudgeScoring(judge) if judge is not None else None
        self.calls = 0
        self.last_stats: RewardCallStats | None = None
        self._last_flushed_step: int | None = None

    def programs(self, completions: Sequence[Any], kwargs: Mapping[str, Any]) -> list[tuple[str, str | None] | None]:
        """One ``(code, tests)`` per completion, ``None`` where there is no code."""
        tests = _tests_for(kwargs, self.tests_column, len(completions))
        out: list[tuple[str, str | None] | None] = []
        for completion, test in zip(completions, tests, strict=True):
            code = self.extractor(completion_text(completion))
            out.append(None if code is None or not code.strip() else (code, test))
        return out

    async def _run_one(self, source: SandboxSource, code: str, tests: str | None) -> _Scored:
        run = harness_run(code, tests)
        async with source() as sandbox:
            try:
                result = await run_python(
                    sandbox,
                    run.source,
                    stdin=run.stdin,
                    timeout_seconds=self.timeout_seconds,
                    python=self.python,
                    exclusive=True,
                )
            except SandboxError as exc:
                if not programs_doing(exc):
                    raise  # the platform's failure (None), or a caller mistake or bug (raised after the batch)
                # The program's own outcome: it ran past its timeout, or took its sandbox down with it.
                partial = exc.result if isinstance(exc, SandboxTimeoutError) else None
                return _Scored(0.0, partial is not None and partial.oom_killed)
        return _Scored(1.0 if run.passed(result) else 0.0, result.oom_killed)

    async def _judge_one(self, source: SandboxSource, session: Session | None, item: JudgeItem) -> _Scored:
        """The judge's score; no verdict (a case starved or the platform failed) is an infrastructure failure."""
        assert self.judging is not None and session is not None
        async with source() as sandbox:
            result = await self.judging.judge(session, sandbox, item)
        if result.score is None:
            raise SandboxError(f"the judge reached no verdict ({result.verdict.value})", infrastructure=True)
        return _Scored(result.score, any(c.verdict.value == "memory_limit" for c in result.cases))

    async def score(
        self, source: SandboxSource, session: Session | None, completions: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> list[float | None]:
        """Score a batch (see the module docstring): one ``1.0``/``0.0``/``None`` per completion, in order.

        Raises the first unexpected error (a bug or caller mistake) after every item has finished.
        """
        from ..gatherer._gather import as_completed

        if isinstance(completions, (str, bytes)) or not isinstance(completions, Sequence):
            raise SandboxValidationError("completions must be a list (one entry per completion)")
        self.calls += 1
        call = self.calls
        work: list[Callable[[], Awaitable[_Scored]]]
        if self.judging is not None:
            items = self.judging.items([completion_text(c) for c in completions], kwargs, self.tests_column)
            index = [i for i, item in enumerate(items) if item is not None]
            work = [functools.partial(self._judge_one, source, session, item) for item in items if item is not None]
            total = len(items)
        else:
            programs = self.programs(completions, kwargs)
            index = [i for i, p in enumerate(programs) if p is not None]
            work = [functools.partial(self._run_one, source, *p) for p in programs if p is not None]
            total = len(programs)
        rewards: list[float | None] = [None] * total
        infra = starved = oom = 0
        bugs: list[BaseException] = []
        if work:
            deadline = self.lease_timeout_seconds + self.timeout_seconds + ITEM_DEADLINE_SLACK_SECONDS
            async with as_completed(work, limit=self.limit, timeout_seconds=deadline) as results:
                async for outcome in results:
                    i = index[outcome.index]
                    if outcome.value is not None:
                        rewards[i] = outcome.value.score
                        oom += outcome.value.oom_killed
                    elif outcome.kind in _NOT_SCORED:
                        infra += 1
                        starved += outcome.kind is OutcomeKind.STARVED
                        log.warning("reward not scored", index=i, kind=str(outcome.kind), error=repr(outcome.error))
                    else:
                        bugs.append(outcome.error or RuntimeError("reward item failed without an error"))
                        log.error("reward item failed unexpectedly", index=i, exc_info=outcome.error)
        stats = RewardCallStats(
            call=call,
            sandboxes=len(work),
            passed=sum(1 for r in rewards if r == 1.0),
            skipped=total - len(work),
            infra_failures=infra,
            step=self._step(kwargs),
            starved=starved,
            oom_killed=oom,
            name=self.name,
        )
        self.last_stats = stats
        self._report(stats, session, kwargs)
        if bugs:
            raise bugs[0]
        return rewards

    @staticmethod
    def _step(kwargs: Mapping[str, Any]) -> int | None:
        step = getattr(kwargs.get("trainer_state"), "global_step", None)
        return step if isinstance(step, int) and not isinstance(step, bool) else None

    def _report(self, stats: RewardCallStats, session: Session | None, kwargs: Mapping[str, Any]) -> None:
        if self.verbose:
            print(stats.line(), flush=True)
        log.info(
            "reward call",
            call=stats.call,
            sandboxes=stats.sandboxes,
            passed=stats.passed,
            skipped=stats.skipped,
            infra_failures=stats.infra_failures,
            starved=stats.starved,
            oom_killed=stats.oom_killed,
            step=stats.step,
        )
        log_metric = kwargs.get("log_metric")
        prefix = f"cwsandbox/{self.name}/" if self.name else "cwsandbox/reward/"
        if callable(log_metric) and stats.sandboxes:
            log_metric(prefix + "pass_rate", stats.passed / stats.sandboxes)
            log_metric(prefix + "infra_failures", float(stats.infra_failures))
            log_metric(prefix + "starved", float(stats.starved))
            log_metric(prefix + "oom_killed", float(stats.oom_killed))
        total = stats.sandboxes + stats.skipped
        if callable(log_metric) and total:
            log_metric(prefix + "no_code_fraction", stats.skipped / total)
        # TRL's global_step counts completed steps: the rewards computed now belong to step
        # global_step + 1, and TRL logs them at train/global_step = global_step + 1. The sandbox
        # metrics of this call go to that same step. One flush per step: a second call within the
        # same step (steps_per_generation > 1, evaluation) folds into the next flush.
        flush_step = None if stats.step is None else stats.step + 1
        if session is not None and flush_step is not None and flush_step != self._last_flushed_step:
            self._last_flushed_step = flush_step
            try:
                session.log_metrics(step=flush_step)
            except Exception as exc:  # metrics must never break a training step
                log.warning("log_metrics failed", step=flush_step, error=repr(exc))
