"""One line that says why a completion got its verdict: the compiler's first error, or the first failing case.

``compile_reason`` picks the first error line of a compiler's output, with the completion's private
directory taken out of its paths: ``solution.py:3:9: SyntaxError: invalid syntax`` (the Python
entry's check prints exactly that), ``main.cpp:4:5: error: 'x' was not declared in this scope``,
``error[E0425]: cannot find value `x` in this scope (main.rs:2:5)``. ``result_reason`` is the
judgement's line (``JudgeResult.reason``): the compiler's first error, or how many cases passed and
the first case with the summary verdict and its detail.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ._types import CaseResult, Verdict

__all__ = ["REASON_CHARS", "compile_reason", "one_line", "result_reason"]

#: The longest reason kept.
REASON_CHARS = 300
_ERROR = re.compile(r"(^|[\s:])(error|Error|ERROR)(\[\w+\])?:|^\S*Error\b|^error\b")
_LOCATION = re.compile(r"^\s*--> (\S+:\d+:\d+)")
_NODE_LOCATION = re.compile(r"^(\S+\.js):(\d+)$")


def one_line(text: str, limit: int = REASON_CHARS) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def compile_reason(output: str, work: str) -> str:
    """The compiler's first error line (``work/`` taken out of paths), or its first line."""
    text = output.replace(f"{work}/", "").replace("./", "")
    lines = [line for line in text.splitlines() if line.strip()]
    for at, line in enumerate(lines):
        if not _ERROR.search(line):
            continue
        for later in lines[at + 1 : at + 4]:  # rustc: the location on a "--> file:line:col" line
            found = _LOCATION.match(later)
            if found:
                return one_line(f"{line.strip()} ({found.group(1)})")
        for earlier in lines[:at]:  # node --check: "main.js:3" first, then the code, then the error
            found = _NODE_LOCATION.match(earlier.strip())
            if found:
                return one_line(f"{found.group(1)}:{found.group(2)}: {line.strip()}")
        return one_line(line)
    return one_line(lines[0]) if lines else "the compiler gave no message"


def result_reason(verdict: Verdict, cases: Sequence[CaseResult], compile_line: str = "") -> str:
    """The judgement's reason line (see the module docstring), without the verdict's name: each
    vocabulary (``Verdict``, ``code_reward``'s ``VerdictKind``) puts its own in front."""
    if verdict is Verdict.COMPILE_ERROR:
        return one_line(compile_line or next((c.detail for c in cases if c.detail), "") or "the compile failed")
    passed = sum(1 for c in cases if c.passed)
    head = f"{passed}/{len(cases)} test cases accepted"
    first = next((c for c in cases if c.verdict is verdict), None)
    if verdict is Verdict.ACCEPTED or first is None:
        return head
    name = first.name or str(first.index)
    return one_line(f"{head}; case {name}: {first.detail}" if first.detail else f"{head}; case {name}")
