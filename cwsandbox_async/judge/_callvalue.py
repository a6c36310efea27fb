"""Call-based results across the pipe: the harness's token line, read and compared with no limit a value can reach.

The call harness (``sandboxed/call_harness.py``) writes a returned value as one line of tokens,
separated by single spaces, in prefix order (a container's tag, then its members):

==========  ==========================================================================
token       value
==========  ==========================================================================
``n``       ``None``
``t``/``f`` ``True`` / ``False``
``i<hex>``  an int in hexadecimal (``i-ff``): any size, read in linear time
``d<repr>`` a float, ``repr`` (``nan``, ``-inf``, ``-0.0`` included)
``s<b64>``  a str (UTF-8, base64)
``r<b64>``  the ``repr`` of any other object (compared as a str)
``L<n>``    a list of the next ``n`` values; ``U<n>`` a tuple; ``S<n>`` a set; ``F<n>`` a
            frozenset; ``D<n>`` a dict of the next ``n`` key, value pairs
==========  ==========================================================================

Nothing here recurses or parses a decimal int of the program's: ``decode`` builds the value with
an explicit stack (any depth), and a malformed line is ``ValueError`` (a wrong answer).

``values_equal`` compares a result with an expected value (a dataset's JSON, or your own), with
both sides normalised the same way: a list equals a tuple with the same members; a set or
frozenset equals another with the same members, or a list (or tuple) of the same members in any
order without repeats (an expected value written as JSON has no sets); a dict's keys compare as
JSON writes them (``1`` and ``"1"`` are the same key); ``True`` is not ``1``; an int equals the
float of the same value; numbers within the tolerance when ``compare="float"`` (set members
exactly). It is iterative too; set members are compared by a digest of their normalised form.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import math
from collections.abc import Callable
from typing import Any

__all__ = ["decode", "encode", "values_equal"]

#: Longest float token accepted (``repr`` of any float is far shorter).
_FLOAT_CHARS = 40
_SEQ = (list, tuple)
_SETS = (set, frozenset)


def _token(value: Any, todo: list[Any]) -> str:
    """``value``'s token (as the harness writes it); a container's members are pushed on ``todo``, first last."""
    if value is None:
        return "n"
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, int):
        return f"i{value:x}"
    if isinstance(value, float):
        return "d" + repr(value)
    if isinstance(value, str):
        return "s" + base64.b64encode(value.encode("utf-8", "surrogatepass")).decode("ascii")
    if isinstance(value, (list, tuple)):
        todo.extend(reversed(value))
        return ("L" if isinstance(value, list) else "U") + str(len(value))
    if isinstance(value, (set, frozenset)):
        todo.extend(value)
        return ("S" if isinstance(value, set) else "F") + str(len(value))
    if isinstance(value, dict):
        for k, v in reversed(list(value.items())):
            todo.extend((v, k))
        return f"D{len(value)}"
    raise TypeError(
        "a call's value must be plain data (None, bool, int, float, str, list, tuple, set, dict), "
        f"got {type(value).__name__}"
    )


def encode(value: Any) -> bytes:
    """``value`` as one token line (the arguments of a call, sent to the harness); no recursion."""
    todo, out = [value], []
    while todo:
        out.append(_token(todo.pop(), todo))
    return " ".join(out).encode("ascii") + b"\n"


def _scalar(tok: bytes) -> Any:
    kind, body = tok[:1], tok[1:]
    if kind == b"n" and not body:
        return None
    if kind in (b"t", b"f") and not body:
        return kind == b"t"
    if kind == b"i" and body and body.lstrip(b"-") and body.lstrip(b"-").isalnum():
        return int(body, 16)
    if kind == b"d" and 0 < len(body) <= _FLOAT_CHARS:
        return float(body)
    if kind in (b"s", b"r"):
        return base64.b64decode(body, validate=True).decode("utf-8", "surrogatepass")
    raise ValueError(f"not a value token: {tok[:20]!r}")


def _count(tok: bytes) -> int:
    body = tok[1:]
    if not body.isdigit() or len(body) > 9:
        raise ValueError("bad container size")
    return int(body)


def _build(kind: bytes, members: list[Any]) -> Any:
    if kind == b"L":
        return members
    if kind == b"U":
        return tuple(members)
    if kind in (b"S", b"F"):
        return frozenset(members)  # hashable, so a set can hold it; equal to the set it was
    return dict(zip(members[0::2], members[1::2], strict=True))


def decode(line: bytes) -> Any:
    """The value of one token line; ``ValueError`` when it is not exactly one well-formed value."""
    try:
        return _decode(line.strip().split(b" "))
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError) as exc:
        raise ValueError(f"malformed result line: {exc}") from None


def _decode(tokens: list[bytes]) -> Any:
    # frames: [kind, members, still to read]; the outermost holds the one value of the line
    frames: list[list[Any]] = [[b"L", [], 1]]
    last = len(tokens) - 1
    for at, tok in enumerate(tokens):
        kind = tok[:1]
        if kind in (b"L", b"U", b"S", b"F", b"D"):
            frames.append([kind, [], _count(tok) * (2 if kind == b"D" else 1)])
        else:
            frames[-1][1].append(_scalar(tok))
            frames[-1][2] -= 1
        while frames[-1][2] == 0:
            kind, members, _ = frames.pop()
            if not frames:
                if at != last:
                    raise ValueError("tokens after the value")
                return members[0]
            frames[-1][1].append(_build(kind, members))
            frames[-1][2] -= 1
    raise ValueError("the line ended inside a value")


def _json_key(key: Any) -> Any:
    """A dict key as ``json.dumps`` would write it (a str), or a digest for keys JSON cannot write."""
    if isinstance(key, str):
        return key
    if isinstance(key, bool):
        return "true" if key else "false"
    if key is None:
        return "null"
    if isinstance(key, int) and abs(key) < 10**300:
        return str(key)
    if isinstance(key, float):
        return repr(key) if math.isfinite(key) else {"inf": "Infinity", "-inf": "-Infinity"}.get(repr(key), "NaN")
    return ("digest", digest(key))


def digest(value: Any) -> bytes:
    """A fixed-size digest of ``value``'s normalised form (see the module docstring), computed without recursion."""
    # post-order: ("enter", v) expands v; ("leave", tag, n) combines the last n digests
    out: list[bytes] = []
    todo: list[tuple[Any, ...]] = [("enter", value)]
    while todo:
        item = todo.pop()
        if item[0] == "leave":
            _, tag, n, ordered = item
            parts = out[len(out) - n :] if n else []
            del out[len(out) - n :]
            if not ordered:
                parts.sort()
            out.append(hashlib.blake2b(tag + b"".join(parts), digest_size=16).digest())
            continue
        v = item[1]
        if item[0] == "digest":
            out.append(v)
        elif isinstance(v, _SEQ):
            todo.append(("leave", b"seq", len(v), True))
            todo.extend(("enter", m) for m in reversed(v))
        elif isinstance(v, _SETS):
            todo.append(("leave", b"set", len(v), False))
            todo.extend(("enter", m) for m in v)
        elif isinstance(v, dict):
            todo.append(("leave", b"dict", len(v), False))
            for k, m in v.items():
                key = _json_key(k)
                todo.append(("leave", b"pair", 2, True))
                todo.append(("enter", m))
                todo.append(("enter", key) if isinstance(key, str) else ("digest", key[1]))
        else:
            out.append(hashlib.blake2b(_atom(v), digest_size=16).digest())
    return out[0]


def _atom(v: Any) -> bytes:
    if isinstance(v, bool) or v is None:
        return b"b" + repr(v).encode()
    if isinstance(v, float) and math.isfinite(v) and v == int(v):
        v = int(v)  # 1.0 == 1, -0.0 == 0
    if isinstance(v, int):
        return b"i" + format(v, "x").encode()
    if isinstance(v, float):
        return b"f" + repr(v).encode()
    if isinstance(v, str):
        return b"s" + v.encode("utf-8", "surrogatepass")
    return b"r" + repr(type(v)).encode() + b":" + str(id(v)).encode()


def _numbers_equal(a: int | float, b: int | float, close: Callable[[float, float], bool] | None) -> bool:
    if a == b:
        return True
    if close is None:
        return False
    try:
        x, y = float(a), float(b)
    except OverflowError:
        return False
    return math.isfinite(x) and math.isfinite(y) and close(x, y)


def _set_equal(a: Any, b: Any) -> bool:
    left, right = [digest(m) for m in a], [digest(m) for m in b]
    return len(set(left)) == len(left) and len(set(right)) == len(right) and set(left) == set(right)


def values_equal(got: Any, want: Any, close: Callable[[float, float], bool] | None = None) -> bool:
    """Whether ``got`` equals ``want`` once both are normalised (see the module docstring); no recursion."""
    todo = [(got, want)]
    while todo:
        a, b = todo.pop()
        if isinstance(a, bool) or isinstance(b, bool):
            if not (isinstance(a, bool) and isinstance(b, bool) and a is b):
                return False
        elif isinstance(a, (int, float)) and isinstance(b, (int, float)):
            if not _numbers_equal(a, b, close):
                return False
        elif isinstance(a, str) or isinstance(b, str) or a is None or b is None:
            if not (type(a) is type(b) and a == b):
                return False
        elif isinstance(a, _SETS) or isinstance(b, _SETS):
            if not (isinstance(a, _SETS + _SEQ) and isinstance(b, _SETS + _SEQ) and _set_equal(a, b)):
                return False
        elif isinstance(a, _SEQ) and isinstance(b, _SEQ):
            if len(a) != len(b):
                return False
            todo.extend(zip(a, b, strict=True))
        elif isinstance(a, dict) and isinstance(b, dict):
            left = {_json_key(k): v for k, v in a.items()}
            right = {_json_key(k): v for k, v in b.items()}
            if len(left) != len(a) or len(right) != len(b) or left.keys() != right.keys():
                return False
            todo.extend((left[k], right[k]) for k in left)
        else:
            return False
    return True
