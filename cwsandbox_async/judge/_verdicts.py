"""From what a case's process did to its verdict, and from the cases' verdicts to the score.

A case that ran to its end with exit 0 is compared (``ACCEPTED`` / ``WRONG_ANSWER``); otherwise, in
this order:

- killed for its CPU time, or more CPU than its limit at the end, or ``SIGXCPU``: ``TIME_LIMIT``;
- killed at its wall limit: ``TIME_LIMIT`` unless it used little CPU while its processes waited for
  one (``suspect_starved``): such a case is re-run alone in its own exec, where the sandbox decides
  (``Sandbox.exec``'s starvation rule, on evidence from outside the program), then ``STARVED``;
- killed for its memory, more memory than its limit at its peak, a kernel OOM kill in the
  sandbox's memory cgroup, or the language's out-of-memory message on stderr: ``MEMORY_LIMIT``;
- its output past the cap: ``WRONG_ANSWER``;
- any other non-zero exit or signal: ``RUNTIME_ERROR``.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence

from ._runjob import STARVED_CPU_SHARE, STARVED_WAIT_SHARE, RawCase
from ._types import CaseResult, Verdict

__all__ = ["classify", "excerpt", "score", "suspect_starved", "summary_verdict", "tail"]

TAIL_CHARS = 4000


#: The most of a case's stdout a result keeps (its head and its tail): the output was compared already.
STDOUT_KEPT_CHARS = 1000


def tail(data: bytes, limit: int = TAIL_CHARS) -> str:
    """The last ``limit`` characters of ``data`` (decoded with replacement; only the end is decoded)."""
    text = data[-4 * limit :].decode("utf-8", "replace")
    return text if len(text) <= limit and len(data) <= 4 * limit else "..." + text[-limit:]


def excerpt(data: bytes, limit: int = STDOUT_KEPT_CHARS) -> str:
    """At most ``limit`` characters of ``data``: all of it, or its head and tail around ``...``."""
    if len(data) <= limit:
        return data.decode("utf-8", "replace")
    half = (limit - 5) // 2
    head = data[: 4 * half].decode("utf-8", "replace")[:half]
    end = data[-4 * half :].decode("utf-8", "replace")[-half:]
    return f"{head} ... {end}"


def suspect_starved(raw: RawCase) -> bool:
    wall = raw.wall_seconds
    return (
        raw.killed == "wall"
        and raw.cpu_seconds < STARVED_CPU_SHARE * wall
        and raw.wait_seconds >= STARVED_WAIT_SHARE * wall
    )


def classify(
    raw: RawCase, *, time_seconds: float, memory_bytes: int | None, oom_markers: Sequence[str], exec_oom: bool
) -> tuple[Verdict, str] | None:
    """The verdict of a case that did not end normally, or ``None`` when its output decides (exit 0)."""
    err = raw.stderr.decode("utf-8", "replace")
    if raw.killed == "time" or raw.cpu_seconds > time_seconds or raw.exit_code == -signal.SIGXCPU:
        return Verdict.TIME_LIMIT, f"used {raw.cpu_seconds:.2f} s of CPU (limit {time_seconds:g} s)"
    if raw.killed == "wall":
        return Verdict.TIME_LIMIT, f"still running after {raw.wall_seconds:.2f} s (used {raw.cpu_seconds:.2f} s of CPU)"
    over = memory_bytes is not None and raw.memory_bytes > memory_bytes
    if raw.killed == "memory" or over:
        limit = f" (limit {memory_bytes / 2**20:.0f} MiB)" if memory_bytes else ""
        return Verdict.MEMORY_LIMIT, f"used {raw.memory_bytes / 2**20:.0f} MiB{limit}"
    if raw.killed == "output":
        return Verdict.WRONG_ANSWER, "output limit exceeded"
    if raw.exit_code == 0:
        return None
    if raw.cgroup_oom or (exec_oom and raw.exit_code == -signal.SIGKILL):
        return Verdict.MEMORY_LIMIT, "killed by the kernel for its memory"
    if any(marker in err for marker in oom_markers):
        return Verdict.MEMORY_LIMIT, "ran out of memory"
    if raw.exit_code < 0:
        try:
            name = signal.Signals(-raw.exit_code).name
        except ValueError:
            name = f"signal {-raw.exit_code}"
        return Verdict.RUNTIME_ERROR, f"killed by {name}"
    return Verdict.RUNTIME_ERROR, f"exit code {raw.exit_code}"


def score(cases: Sequence[CaseResult], mode: str, total: int) -> float | None:
    """The score of ``total`` cases under ``mode`` (``None``: no verdict could be reached)."""
    failed = any(not c.passed and not c.verdict.not_scored for c in cases)
    unscored = any(c.verdict.not_scored for c in cases)
    if mode in ("all", "first_failure"):
        if failed:
            return 0.0
        return None if unscored else 1.0
    if unscored:
        return None
    return sum(c.passed for c in cases) / total if total else 1.0


_ORDER = (
    Verdict.COMPILE_ERROR,
    Verdict.RUNTIME_ERROR,
    Verdict.MEMORY_LIMIT,
    Verdict.TIME_LIMIT,
    Verdict.WRONG_ANSWER,
)


def summary_verdict(cases: Sequence[CaseResult]) -> Verdict:
    """The completion's verdict: the first failing case's, else ``STARVED``/``INFRASTRUCTURE``, else accepted."""
    for case in cases:
        if case.verdict in _ORDER:
            return case.verdict
    for case in cases:
        if case.verdict.not_scored:
            return case.verdict
    return Verdict.ACCEPTED
