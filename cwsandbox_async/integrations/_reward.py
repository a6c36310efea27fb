"""The scoring core behind the TRL reward functions: extract, run against the tests, 1.0 / 0.0 / None.

Each program runs under a test harness (``_split`` by default: the tests in a
process the program cannot reach; ``_harness`` in-process): 1.0 needs the tests to
have run to their end, so ending the process early scores 0.0. Every completion
gets a ``CompletionVerdict`` (``_verdicts``: its kind, score, exit, times, stderr
tail); outcomes map as:

- the program's own outcome is a score: it failed, ran past its timeout, was
  OOM-killed, exceeded its CPU budget, or took its own sandbox down (a
  ``SandboxError`` with ``infrastructure=False``): 0.0;
- a starved timeout is re-run (``_item``) before it is left unscored;
- the platform's failure is ``None`` ("not scored"), counted in
  ``infra_failures``: an infrastructure error, a program still starved after its
  retries (also counted in ``starved``), the item deadline;
- a caller mistake or a bug (any other exception) is logged at ERROR and raised
  once the whole batch has finished, never turned into a score.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog

from .._errors import SandboxValidationError
from .._log import log
from .._validate import validate_timeout
from ..gatherer._outcome import OutcomeKind
from ..judge._reward import JudgeItem, JudgeOptions, JudgeScoring
from ._extract import completion_text, extract_code, foreign_fence
from ._item import HARNESSES, ItemSettings, run_item
from ._verdict_table import log_verdict_table
from ._verdicts import CompletionVerdict, VerdictKind, judged_verdict

if TYPE_CHECKING:
    from .._sandbox import Sandbox
    from .._session import Session

__all__ = ["Extractor", "RewardCallStats", "RewardCore", "SandboxSource", "VerdictCallback"]

#: Turns a completion's text into code, or ``None`` when it holds none.
Extractor = Callable[[str], "str | None"]
#: Hands out one sandbox per program: ``async with source() as sandbox``.
SandboxSource = Callable[[], AbstractAsyncContextManager["Sandbox"]]

#: Slack added to each item's deadline beyond lease wait + program timeout (exec grace, file transfer).
ITEM_DEADLINE_SLACK_SECONDS = 30.0
#: Outcome kinds that mean "the platform could not reach a verdict": ``None``, counted as infra failures.
_NOT_SCORED = frozenset({OutcomeKind.INFRA, OutcomeKind.STARVED, OutcomeKind.TIMEOUT, OutcomeKind.CANCELLED})
#: Called once per reward call with every completion's verdict, in order.
VerdictCallback = Callable[[Sequence[CompletionVerdict]], None]


@dataclass(frozen=True, slots=True)
class RewardCallStats:
    """What one reward call did. ``sandboxes`` programs ran; ``skipped`` completions had no code;
    ``infra_failures`` got ``None`` because the platform failed (or missed its deadline), ``starved``
    of them because their wall timeout fired while others held the CPUs, on the first run and on
    every retry; ``starved_retried`` items were re-run after a starved first run (whatever their
    end); ``oom_killed`` programs were killed for their memory (scored 0.0). ``kinds`` counts every
    completion's ``VerdictKind`` (by its string). ``step`` is TRL's ``trainer_state.global_step``
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
    starved_retried: int = 0
    kinds: Mapping[str, int] = field(default_factory=dict)

    def count(self, kind: VerdictKind) -> int:
        """How many completions ended as ``kind``."""
        return self.kinds.get(str(kind), 0)

    def line(self) -> str:
        """The familiar one-line summary, naming the reward (two in one trainer print different lines)."""
        named = f" ({self.name})" if self.name else ""
        text = (
            f"[CWSandbox] Reward call {self.call}{named}: {self.sandboxes} sandboxes, "
            f"{self.passed}/{self.sandboxes} passed, {self.skipped} skipped (no code)"
        )
        for kind, label in _LINE_LABELS:
            if self.count(kind):
                text += f", {self.count(kind)} {label}"
        if self.infra_failures:
            text += f", {self.infra_failures} infra failures (not scored"
            text += f"; {self.starved} starved of CPU)" if self.starved else ")"
        if self.starved_retried:
            text += f", {self.starved_retried} retried after starving"
        return text


#: The kinds the printed line counts, in order, and their words.
_LINE_LABELS = (
    (VerdictKind.WRONG_ANSWER, "wrong"),
    (VerdictKind.ERROR_EXIT, "errors"),
    (VerdictKind.EARLY_EXIT, "early exits"),
    (VerdictKind.TIMEOUT, "timed out"),
    (VerdictKind.CPU_BUDGET, "over CPU budget"),
    (VerdictKind.OOM, "out of memory"),
    (VerdictKind.COMPILE_ERROR, "compile errors"),
    (VerdictKind.PARTIAL, "partly passed"),
)


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
        harness: str = "split",
        starved_retries: int = 1,
        starved_retry_timeout_seconds: float | None = None,
        on_verdicts: VerdictCallback | None = None,
        verdict_table: int = 0,
        run: Any = None,
        judge: JudgeOptions | None = None,
    ) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise SandboxValidationError(f"limit must be a positive int, got {limit!r}")
        if extractor is not None and not callable(extractor):
            raise SandboxValidationError("extractor must be a callable str -> str | None")
        if harness not in HARNESSES:
            raise SandboxValidationError(f"harness must be one of {', '.join(HARNESSES)}, got {harness!r}")
        for what, n in (("starved_retries", starved_retries), ("verdict_table", verdict_table)):
            if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= 1000:
                raise SandboxValidationError(f"{what} must be an int from 0 to 1000, got {n!r}")
        if on_verdicts is not None and not callable(on_verdicts):
            raise SandboxValidationError("on_verdicts must be a callable taking the list of verdicts")
        self.extractor: Extractor = extractor or extract_code
        self.tests_column = tests_column
        self.timeout_seconds = validate_timeout(timeout_seconds) or 0.0
        self.lease_timeout_seconds = validate_timeout(lease_timeout_seconds, "lease_timeout_seconds") or 0.0
        retry = 4 * self.timeout_seconds if starved_retry_timeout_seconds is None else starved_retry_timeout_seconds
        self.item = ItemSettings(
            timeout_seconds=self.timeout_seconds,
            python=python,
            harness=harness,
            starved_retries=starved_retries,
            starved_retry_timeout_seconds=validate_timeout(retry, "starved_retry_timeout_seconds") or 0.0,
        )
        self.limit = limit
        self.python = python
        self.verbose = verbose
        self.name = name
        self.on_verdicts = on_verdicts
        self.verdict_table = verdict_table
        self.run = run
        #: With ``judge``, completions are judged against the row's test cases (``judge._reward``).
        self.judging = JudgeScoring(judge) if judge is not None else None
        self.calls = 0
        self.last_stats: RewardCallStats | None = None
        self.last_verdicts: list[CompletionVerdict] = []
        self._last_flushed_step: int | None = None

    def programs(self, completions: Sequence[Any], kwargs: Mapping[str, Any]) -> list[tuple[str, str | None] | None]:
        """One ``(code, tests)`` per completion, ``None`` where there is no code."""
        tests = _tests_for(kwargs, self.tests_column, len(completions))
        out: list[tuple[str, str | None] | None] = []
        for completion, test in zip(completions, tests, strict=True):
            code = self.extractor(completion_text(completion))
            out.append(None if code is None or not code.strip() else (code, test))
        return out

    def _no_program(self, index: int, completion: Any) -> CompletionVerdict:
        """The verdict of a completion without Python code: code in another language is a 0.0, never unscored.

        With the default extractor, a completion whose last fenced block names another language
        (```` ```cpp ````) holds a program this reward does not run: ``compile_error``, 0.0, so a policy
        cannot escape a wrong answer's 0.0 by fencing it otherwise. No code at all is ``no_code`` (None).
        """
        language = foreign_fence(completion_text(completion)) if self.extractor is extract_code else None
        if language is not None:
            reason = f"its code is fenced as {language!r}; this reward runs Python"
            return CompletionVerdict(index, VerdictKind.COMPILE_ERROR, 0.0, reason)
        return CompletionVerdict(index, VerdictKind.NO_CODE, None, "the completion holds no code")

    async def _run_one(self, source: SandboxSource, index: int, code: str, tests: str | None) -> CompletionVerdict:
        # every log line of this item (the exec's timeout, a retry) names its completion
        with structlog.contextvars.bound_contextvars(completion=index):
            async with source() as sandbox:
                return await run_item(sandbox, index, code, tests, self.item)

    def _deadline(self, judged: Sequence[JudgeItem] = ()) -> float:
        """Each item's deadline: lease wait + its own budget + slack. A program's budget is its timeout
        plus each starved retry's wall budget; a judged completion's is the judge's own
        (``Judge.budget_seconds``: compile, every case at its wall limit, sweeps, reruns, checker),
        the longest of the batch's, so a program that sleeps through its cases is scored, not cut off."""
        item = self.item
        if self.judging is not None:
            budget = self.judging.budget_seconds(judged)
        else:
            budget = self.timeout_seconds + item.starved_retries * item.starved_retry_timeout_seconds
        return self.lease_timeout_seconds + budget + ITEM_DEADLINE_SLACK_SECONDS

    async def _judge_one(
        self, source: SandboxSource, session: Session | None, index: int, item: JudgeItem
    ) -> CompletionVerdict:
        """The judge's verdict as a completion's: its score, kind, reason, and every test case in ``cases``.

        A completion in a language outside the allow-list is 0.0 (``compile_error``) without a
        sandbox; a sandbox the judge could not clean is stopped, so its lease is never reused."""
        assert self.judging is not None and session is not None
        if item.refused:
            return CompletionVerdict(
                index, VerdictKind.COMPILE_ERROR, 0.0, f"{VerdictKind.COMPILE_ERROR}: {item.refused}"
            )
        with structlog.contextvars.bound_contextvars(completion=index):
            async with source() as sandbox:
                result = await self.judging.judge(session, sandbox, item)
                if not result.clean:
                    log.warning("judged sandbox not clean: stopping it", sandbox_id=sandbox.sandbox_id)
                    await sandbox.stop()
        verdict = judged_verdict(index, result, sandbox.sandbox_id)
        return dataclasses.replace(verdict, reason=f"{verdict.kind}: {result.reason}") if result.reason else verdict

    async def score(
        self, source: SandboxSource, session: Session | None, completions: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> list[float | None]:
        """Score a batch (see the module docstring): one ``1.0``/``0.0``/``None`` per completion, in order.

        Sets ``last_verdicts`` (one ``CompletionVerdict`` per completion) and ``last_stats``, then
        calls ``on_verdicts``. Raises the first unexpected error (a bug or caller mistake) after every
        item has finished.
        """
        from ..gatherer._gather import as_completed

        if isinstance(completions, (str, bytes)) or not isinstance(completions, Sequence):
            raise SandboxValidationError("completions must be a list (one entry per completion)")
        self.calls += 1
        call = self.calls
        work: list[Callable[[], Awaitable[CompletionVerdict]]]
        judged: list[JudgeItem] = []
        if self.judging is not None:
            items = self.judging.items([completion_text(c) for c in completions], kwargs, self.tests_column)
            judged = [item for item in items if item is not None]
            verdicts: list[CompletionVerdict | None] = [
                CompletionVerdict(i, VerdictKind.NO_CODE, None, "the completion holds no code or no test cases")
                if item is None
                else None
                for i, item in enumerate(items)
            ]
            index = [i for i, item in enumerate(items) if item is not None]
            work = [
                functools.partial(self._judge_one, source, session, i, item)
                for i, item in enumerate(items)
                if item is not None
            ]
        else:
            programs = self.programs(completions, kwargs)
            verdicts = [None] * len(programs)
            for i, p in enumerate(programs):
                if p is None:
                    verdicts[i] = self._no_program(i, completions[i])
            index = [i for i, p in enumerate(programs) if p is not None]
            work = [functools.partial(self._run_one, source, i, *p) for i, p in enumerate(programs) if p is not None]
        bugs: list[BaseException] = []
        if work:
            async with as_completed(work, limit=self.limit, timeout_seconds=self._deadline(judged)) as results:
                async for outcome in results:
                    i = index[outcome.index]
                    if outcome.value is not None:
                        verdicts[i] = outcome.value
                    elif outcome.kind in _NOT_SCORED:
                        verdicts[i] = _not_scored(i, outcome.kind, outcome.error)
                        log.warning("reward not scored", index=i, kind=str(outcome.kind), error=repr(outcome.error))
                    else:
                        bugs.append(outcome.error or RuntimeError("reward item failed without an error"))
                        log.error("reward item failed unexpectedly", index=i, exc_info=outcome.error)
        # An item that raised a bug has no verdict (its error is raised below); it is counted nowhere.
        done = [v for v in verdicts if v is not None]
        kinds = Counter(str(v.kind) for v in done)
        stats = RewardCallStats(
            call=call,
            sandboxes=len(work),
            passed=kinds[VerdictKind.PASSED],
            skipped=kinds[VerdictKind.NO_CODE],
            infra_failures=kinds[VerdictKind.INFRASTRUCTURE] + kinds[VerdictKind.STARVED],
            step=self._step(kwargs),
            starved=kinds[VerdictKind.STARVED],
            oom_killed=kinds[VerdictKind.OOM],
            name=self.name,
            starved_retried=sum(1 for v in done if v.retries),
            kinds=dict(kinds),
        )
        self.last_stats, self.last_verdicts = stats, done
        for v in done:
            log.debug("reward verdict", call=call, **v.as_dict())
        self._report(stats, session, kwargs)
        if bugs:
            raise bugs[0]
        if self.on_verdicts is not None:
            self.on_verdicts(list(done))
        return [v.score if v is not None else None for v in verdicts]

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
            starved_retried=stats.starved_retried,
            kinds=dict(stats.kinds),
            step=stats.step,
        )
        log_metric = kwargs.get("log_metric")
        prefix = f"cwsandbox/{self.name}/" if self.name else "cwsandbox/reward/"
        if callable(log_metric) and stats.sandboxes:
            log_metric(prefix + "pass_rate", stats.passed / stats.sandboxes)
            log_metric(prefix + "infra_failures", float(stats.infra_failures))
            log_metric(prefix + "starved", float(stats.starved))
            log_metric(prefix + "oom_killed", float(stats.oom_killed))
            log_metric(prefix + "timeouts", float(stats.count(VerdictKind.TIMEOUT)))
            log_metric(prefix + "starved_retried", float(stats.starved_retried))
        total = stats.sandboxes + stats.skipped
        if callable(log_metric) and total:
            log_metric(prefix + "no_code_fraction", stats.skipped / total)
        # TRL's global_step counts completed steps: the rewards computed now belong to step
        # global_step + 1, and TRL logs them at train/global_step = global_step + 1. The sandbox
        # metrics of this call go to that same step. One flush per step: a second call within the
        # same step (steps_per_generation > 1, evaluation) folds into the next flush.
        flush_step = None if stats.step is None else stats.step + 1
        if self.verdict_table:
            log_verdict_table(self.run, prefix + "worst_verdicts", self.last_verdicts, self.verdict_table, flush_step)
        if session is not None and flush_step is not None and flush_step != self._last_flushed_step:
            self._last_flushed_step = flush_step
            try:
                session.log_metrics(step=flush_step)
            except Exception as exc:  # metrics must never break a training step
                log.warning("log_metrics failed", step=flush_step, error=repr(exc))


def _not_scored(index: int, kind: OutcomeKind, error: BaseException | None) -> CompletionVerdict:
    """The verdict of an item the platform could not judge (its outcome kind is in ``_NOT_SCORED``)."""
    if kind is OutcomeKind.TIMEOUT:
        return CompletionVerdict(index, VerdictKind.INFRASTRUCTURE, None, "missed the item deadline")
    verdict_kind = VerdictKind.STARVED if kind is OutcomeKind.STARVED else VerdictKind.INFRASTRUCTURE
    message = getattr(error, "message", None) or repr(error)
    return CompletionVerdict(index, verdict_kind, None, str(message))
