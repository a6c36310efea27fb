"""The scoring core behind the TRL reward functions: extract, run (optionally against tests), 1.0 / 0.0 / None."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._errors import SandboxTimeoutError, SandboxValidationError
from .._log import log
from .._validate import validate_timeout
from ._extract import completion_text, extract_code
from ._run import run_python

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


@dataclass(frozen=True, slots=True)
class RewardCallStats:
    """What one reward call did. ``sandboxes`` programs ran; ``skipped`` completions had no code;
    ``infra_failures`` got ``None`` because the platform failed (or missed its deadline)."""

    call: int
    sandboxes: int
    passed: int
    skipped: int
    infra_failures: int
    step: int | None

    def line(self) -> str:
        """The familiar one-line summary."""
        text = (
            f"[CWSandbox] Reward call {self.call}: {self.sandboxes} sandboxes, "
            f"{self.passed}/{self.sandboxes} passed, {self.skipped} skipped (no code)"
        )
        if self.infra_failures:
            text += f", {self.infra_failures} infra failures (not scored)"
        return text


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
        self.calls = 0
        self.last_stats: RewardCallStats | None = None
        self._last_flushed_step: int | None = None

    def programs(self, completions: Sequence[Any], kwargs: Mapping[str, Any]) -> list[str | None]:
        """One program per completion (code + its tests), ``None`` where there is no code."""
        tests = _tests_for(kwargs, self.tests_column, len(completions))
        out: list[str | None] = []
        for completion, test in zip(completions, tests, strict=True):
            code = self.extractor(completion_text(completion))
            if code is None or not code.strip():
                out.append(None)
            else:
                out.append(code if test is None else f"{code}\n\n{test}\n")
        return out

    async def _run_one(self, source: SandboxSource, program: str) -> float:
        async with source() as sandbox:
            try:
                result = await run_python(sandbox, program, timeout_seconds=self.timeout_seconds, python=self.python)
            except SandboxTimeoutError as exc:
                if exc.infrastructure:
                    raise
                return 0.0  # the program ran too long: its own outcome
        return 1.0 if result.returncode == 0 else 0.0

    async def score(
        self, source: SandboxSource, session: Session | None, completions: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> list[float | None]:
        """Score a batch: 1.0 passed, 0.0 failed (non-zero exit, timeout), ``None`` no code or infra failure."""
        from ..gatherer._gather import as_completed

        if isinstance(completions, (str, bytes)) or not isinstance(completions, Sequence):
            raise SandboxValidationError("completions must be a list (one entry per completion)")
        self.calls += 1
        call = self.calls
        programs = self.programs(completions, kwargs)
        rewards: list[float | None] = [None] * len(programs)
        todo = [(i, p) for i, p in enumerate(programs) if p is not None]
        work = [functools.partial(self._run_one, source, p) for _, p in todo]
        infra = 0
        if work:
            deadline = self.lease_timeout_seconds + self.timeout_seconds + ITEM_DEADLINE_SLACK_SECONDS
            async with as_completed(work, limit=self.limit, timeout_seconds=deadline) as results:
                async for outcome in results:
                    i = todo[outcome.index][0]
                    if outcome.ok:
                        rewards[i] = outcome.value
                    else:
                        infra += 1
                        log.warning("reward not scored", index=i, kind=str(outcome.kind), error=repr(outcome.error))
        step = self._step(kwargs)
        stats = RewardCallStats(
            call=call,
            sandboxes=len(work),
            passed=sum(1 for r in rewards if r == 1.0),
            skipped=len(programs) - len(work),
            infra_failures=infra,
            step=step,
        )
        self.last_stats = stats
        self._report(stats, session, kwargs)
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
            step=stats.step,
        )
        log_metric = kwargs.get("log_metric")
        if callable(log_metric) and stats.sandboxes:
            log_metric("cwsandbox/reward/pass_rate", stats.passed / stats.sandboxes)
            log_metric("cwsandbox/reward/infra_failures", float(stats.infra_failures))
        total = stats.sandboxes + stats.skipped
        if callable(log_metric) and total:
            log_metric("cwsandbox/reward/no_code_fraction", stats.skipped / total)
        # One flush per training step: a second call within the same step folds into the next flush.
        if session is not None and stats.step is not None and stats.step != self._last_flushed_step:
            self._last_flushed_step = stats.step
            try:
                session.log_metrics(step=stats.step)
            except Exception as exc:  # metrics must never break a training step
                log.warning("log_metrics failed", step=stats.step, error=repr(exc))
