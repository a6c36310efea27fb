"""The judge's data: test cases, limits, verdicts and results (frozen dataclasses)."""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .._errors import SandboxError, SandboxValidationError

__all__ = [
    "CaseResult",
    "JudgeError",
    "JudgeResult",
    "Limits",
    "ScoreMode",
    "TestCase",
    "ToolchainError",
    "Verdict",
]

ScoreMode = Literal["fraction", "all", "first_failure"]
SCORE_MODES = ("fraction", "all", "first_failure")


class Verdict(enum.StrEnum):
    """One test case's verdict. ``INFRASTRUCTURE`` and ``STARVED`` mean "no verdict": the platform's fault."""

    ACCEPTED = "accepted"
    WRONG_ANSWER = "wrong_answer"
    TIME_LIMIT = "time_limit"
    MEMORY_LIMIT = "memory_limit"
    RUNTIME_ERROR = "runtime_error"
    COMPILE_ERROR = "compile_error"
    #: Not run: judging stopped before it (first failure, or the program took the runner down).
    SKIPPED = "skipped"
    #: The platform failed (the sandbox died for outside reasons, a transport broke): not scored.
    INFRASTRUCTURE = "infrastructure"
    #: The case's time ran out while it was starved of CPU by others (seen twice): not scored.
    STARVED = "starved"

    @property
    def not_scored(self) -> bool:
        return self in (Verdict.INFRASTRUCTURE, Verdict.STARVED)


class JudgeError(SandboxError):
    """The judge could not be used as asked (a bad checker, a runner that cannot start): the caller's to fix."""

    infrastructure = False


class ToolchainError(JudgeError):
    """A language's toolchain is missing or broken in the sandbox (found before any scoring started)."""

    def __init__(self, message: str, *, language: str, output: str = "", sandbox_id: str | None = None) -> None:
        super().__init__(message, sandbox_id=sandbox_id)
        self.language = language
        self.output = output


@dataclass(frozen=True, slots=True)
class TestCase:
    """One test: ``input`` on stdin and the ``expected`` stdout; or, for call-based problems
    (``call`` set), the arguments as ``input`` (a list) and the return value as ``expected``.

    ``name`` labels it in results (e.g. ``"public/0"``).
    """

    __test__ = False  # not a pytest class

    input: str | bytes | list[Any]
    expected: str | bytes | Any
    name: str = ""
    call: bool = False

    def stdin_bytes(self) -> bytes:
        if self.call:
            from ._callvalue import encode

            args = (
                list(self.input)
                if isinstance(self.input, Sequence) and not isinstance(self.input, str)
                else [self.input]
            )
            try:
                return encode(args)
            except TypeError as exc:
                raise SandboxValidationError(f"test case {self.name or ''!r}: {exc}") from None
        data = self.input
        if isinstance(data, str):
            return data.encode("utf-8", "surrogatepass")
        if isinstance(data, bytes):
            return data
        raise SandboxValidationError(f"test case {self.name or ''!r}: input must be str or bytes, got {type(data)}")


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-case limits.

    - ``time_seconds``: CPU time of the case's whole process tree (plus the language's
      ``time_extra_seconds``); past it the case is killed: ``TIME_LIMIT``.
    - ``wall_factor``/``wall_extra_seconds``: the wall-clock limit is
      ``time * wall_factor + wall_extra_seconds``; a case that sleeps past it is ``TIME_LIMIT``,
      one whose time ran out while it waited for a CPU is re-run alone, then ``STARVED``.
    - ``memory_mib``: resident memory of the case's tree (plus the language's
      ``memory_extra_mib``), sampled every ``sample_seconds`` and checked against every
      process's peak at the end: ``MEMORY_LIMIT``. The sandbox's own memory limit must be higher.
    - ``output_mib``: stdout kept per case with a ``Checker`` (more is ``WRONG_ANSWER``; raised
      to twice the expected output when that is larger). The built-in comparisons keep twice the
      expected output plus 4 KiB (a longer output cannot match unless by that much trailing
      whitespace), whatever ``output_mib`` says. ``stderr_bytes``: the tail of stderr kept per
      case (for the verdict's detail).
    """

    time_seconds: float = 2.0
    memory_mib: int = 256
    wall_factor: float = 2.0
    wall_extra_seconds: float = 1.0
    output_mib: float = 1.0
    stderr_bytes: int = 2048
    sample_seconds: float = 0.005

    def __post_init__(self) -> None:
        for name in ("time_seconds", "wall_factor", "output_mib", "sample_seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise SandboxValidationError(f"Limits.{name} must be a finite number > 0, got {value!r}")
        if not (isinstance(self.wall_extra_seconds, (int, float)) and self.wall_extra_seconds >= 0):
            raise SandboxValidationError("Limits.wall_extra_seconds must be >= 0")
        for name in ("memory_mib", "stderr_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise SandboxValidationError(f"Limits.{name} must be a positive int, got {value!r}")


@dataclass(frozen=True, slots=True)
class CaseResult:
    """What one case did and its verdict. ``detail`` says why (a checker's message, the signal, ...).

    ``stdout`` is a short excerpt of what the case printed (its head and tail, ``STDOUT_KEPT_CHARS``
    at most), ``stderr_tail`` the end of its stderr: the output itself is compared and dropped."""

    index: int
    name: str
    verdict: Verdict
    exit_code: int | None = None
    cpu_seconds: float = 0.0
    wall_seconds: float = 0.0
    memory_bytes: int = 0
    stdout: str = ""
    stderr_tail: str = ""
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.verdict is Verdict.ACCEPTED


@dataclass(frozen=True, slots=True)
class JudgeResult:
    """One completion's judgement: per-case results, and the score under the judge's ``score`` mode.

    ``score`` is ``None`` when no verdict could be reached (a case was ``INFRASTRUCTURE`` or
    ``STARVED`` and no failure decided it anyway): a trainer leaves it out rather than read it as 0.
    ``compile_output`` is the compiler's message (tail-capped) on a compile error; ``reason`` one
    line that says why (the compiler's first error, or the first failing case's verdict and
    detail). ``clean`` is ``False`` when the judge could not remove everything the completion
    wrote in its sandbox (see ``docs/judge.md``): do not judge another completion in that sandbox.
    """

    language: str
    verdict: Verdict
    score: float | None
    cases: tuple[CaseResult, ...] = field(default_factory=tuple)
    compile_output: str = ""
    compile_seconds: float = 0.0
    reason: str = ""
    clean: bool = True

    @property
    def passed(self) -> int:
        return sum(1 for c in self.cases if c.verdict is Verdict.ACCEPTED)

    @property
    def infrastructure(self) -> bool:
        return self.score is None

    def counts(self) -> dict[str, int]:
        """Cases per verdict (only the verdicts that occurred)."""
        out: dict[str, int] = {}
        for case in self.cases:
            out[case.verdict.value] = out.get(case.verdict.value, 0) + 1
        return out
