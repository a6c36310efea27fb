"""The split harness's driver side: what to send, and how to read the verdict (see ``_split_program``).

The tests run in a process the candidate cannot reach (T: non-dumpable, so no
``/proc/<pid>/mem``, fds or ``ptrace``; forked off before it read its input, so the
candidate's process C never held the nonce or the tests). The candidate is called
across a pipe with plain data, so a pass depends on the values it returned, not on
a secret in its memory. The verdict is the last line of stdout, written by T:
``cwsandbox-verdict <nonce> {"kind": ..., "reason": ...}``; the nonce is fresh per run
and only T and the driver know it.

What the tests' namespace takes from the program, what crosses the pipe and how,
and where T imports from: ``_split_program``'s docstring.

Limits (docs/outcomes.md, "What the split harness cannot split"): tests that look
inside the candidate's module or objects (``inspect``, ``globals()``, ``isinstance``
against a class the program defines, ``==`` with an object the program made,
identity of mutated nested objects, module state read after a call) fail here;
run them with ``harness="in_process"``, which has the holes listed there.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .._types import ExecResult

__all__ = ["SPLIT_SOURCE", "VERDICT_PREFIX", "HarnessVerdict", "SplitRun", "split_run"]

#: T's verdict line starts with this, then the run's nonce.
VERDICT_PREFIX = b"cwsandbox-verdict "
_KINDS = frozenset({"passed", "wrong_answer", "error_exit", "early_exit", "compile_error", "tests_error"})


@cache
def _source() -> str:
    return Path(__file__).with_name("_split_program.py").read_text(encoding="utf-8")


#: The program the sandbox runs (``python3 -c``). Constant: it holds no secret.
SPLIT_SOURCE = _source()


@dataclass(frozen=True, slots=True)
class HarnessVerdict:
    """What the harness said: ``kind`` and why (``reason``, one line).

    Kinds: ``passed``, ``wrong_answer``, ``error_exit``, ``early_exit``, ``compile_error`` (the
    program does not compile: file, line and the interpreter's message), ``tests_error`` (the
    tests do not compile: the caller's mistake, raised by ``_item.judge``).
    """

    kind: str
    reason: str


@dataclass(frozen=True, slots=True)
class SplitRun:
    """One run of a candidate against its tests under the split harness."""

    source: str
    stdin: bytes
    nonce: bytes

    def verdict(self, result: ExecResult) -> HarnessVerdict | None:
        """T's verdict if its last stdout line carries this run's nonce, else ``None`` (T did not report)."""
        out = result.stdout_bytes.rstrip(b"\n")
        line = out.rsplit(b"\n", 1)[-1]
        head = VERDICT_PREFIX + self.nonce + b" "
        if not line.startswith(head):
            return None
        try:
            data = json.loads(line[len(head) :])
        except ValueError:
            return None
        if not isinstance(data, dict) or data.get("kind") not in _KINDS:
            return None
        return HarnessVerdict(str(data["kind"]), str(data.get("reason", "")))

    def passed(self, result: ExecResult) -> bool:
        """True only if T reported a pass and the exec ended cleanly (exit 0, no kill, no truncation)."""
        v = self.verdict(result)
        return (
            v is not None
            and v.kind == "passed"
            and result.returncode == 0
            and not (result.timed_out or result.truncated or result.oom_killed or result.cpu_exceeded)
        )

    def output(self, result: ExecResult) -> str:
        """T's stdout without the verdict line (the candidate's own prints are on stderr)."""
        out = result.stdout_bytes
        cut = out.rfind(b"\n" + VERDICT_PREFIX + self.nonce)
        if cut >= 0:
            out = out[:cut]
        return out.decode("utf-8", errors="replace")


def split_run(code: str, tests: str | None) -> SplitRun:
    """A ``SplitRun`` of ``code`` against ``tests`` (``None``: the candidate must only run to its end).

    Both must be encodable as UTF-8 (``clean_text`` makes them so). A fresh nonce per call.
    """
    nonce = secrets.token_hex(16).encode()
    program, checks = code.encode("utf-8"), (tests or "").encode("utf-8")
    header = b"%s %010d %010d %d\n" % (nonce, len(program), len(checks), int(tests is not None))
    return SplitRun(source=SPLIT_SOURCE, stdin=header + program + checks, nonce=nonce)
