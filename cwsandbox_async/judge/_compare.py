"""Comparing a case's captured stdout with its expected output, in the driver (never in the program's process).

Modes (``Judge(compare=...)``):

- ``"exact"``: byte for byte;
- ``"whitespace"`` (the default): trailing whitespace of every line and trailing blank lines
  are ignored (``\\r\\n`` counts as ``\\n``);
- ``"float"``: token by token (any whitespace separates); two tokens that both parse as
  finite numbers are equal within ``abs_tol`` or ``rel_tol`` (default 1e-6 each), other tokens
  must be equal as text;
- a ``Checker``: a program run in the sandbox, as its own process, after every process of the
  completion was killed (see ``_checker``).

Call-based cases compare values (``_callvalue``: read without recursion or decimal parsing, both
sides normalised alike: lists and tuples, sets against sets or unordered lists, JSON's dict keys),
numbers within the float tolerance when ``compare="float"``; a list-wrapped expected value (APPS
writes ``[x]``) also accepts ``x``.
"""

from __future__ import annotations

import math
from typing import Any

from .._errors import SandboxValidationError
from ._callvalue import decode, values_equal

__all__ = ["COMPARE_MODES", "compare_call", "compare_text", "expected_bytes"]

COMPARE_MODES = ("exact", "whitespace", "float")
DEFAULT_TOL = 1e-6


def expected_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n".join(value).encode("utf-8", "surrogatepass")
    raise SandboxValidationError(f"an stdin/stdout case's expected output must be str or bytes, got {type(value)}")


def _lines(data: bytes) -> list[bytes]:
    lines = [line.rstrip() for line in data.replace(b"\r\n", b"\n").split(b"\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _number(token: bytes) -> float | None:
    try:
        value = float(token)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _close(a: float, b: float, rel: float, abs_: float) -> bool:
    return abs(a - b) <= max(abs_, rel * max(abs(a), abs(b)))


def _tokens_equal(got: bytes, want: bytes, rel: float, abs_: float) -> bool:
    left, right = got.split(), want.split()
    if len(left) != len(right):
        return False
    for a, b in zip(left, right, strict=True):
        if a == b:
            continue
        x, y = _number(a), _number(b)
        if x is None or y is None or not _close(x, y, rel, abs_):
            return False
    return True


def compare_text(
    mode: str, got: bytes, want: bytes, *, rel_tol: float = DEFAULT_TOL, abs_tol: float = DEFAULT_TOL
) -> bool:
    """Whether stdout ``got`` matches ``want`` under ``mode`` (one of ``COMPARE_MODES``)."""
    if mode == "exact":
        return got == want
    if mode == "whitespace":
        return _lines(got) == _lines(want)
    if mode == "float":
        return _tokens_equal(got, want, rel_tol, abs_tol)
    raise SandboxValidationError(f"compare must be one of {', '.join(COMPARE_MODES)} or a Checker, got {mode!r}")


def compare_call(
    mode: str, stdout: bytes, want: Any, *, rel_tol: float = DEFAULT_TOL, abs_tol: float = DEFAULT_TOL
) -> bool:
    """Whether the call harness's result line (its last stdout line, ``_callvalue``'s tokens) equals ``want``."""
    line = stdout.rstrip(b"\n").rpartition(b"\n")[2]
    if not line.strip():
        return False
    try:
        got = decode(line)
    except ValueError:
        return False
    close = (lambda a, b: _close(a, b, rel_tol, abs_tol)) if mode == "float" else None
    if values_equal(got, want, close):
        return True
    return isinstance(want, list) and len(want) == 1 and values_equal(got, want[0], close)
