"""Input validation: bad input raises SandboxValidationError and never reaches a backend."""

from __future__ import annotations

import math
import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, overload

from ._errors import SandboxValidationError

__all__ = [
    "MAX_ARGV_BYTES",
    "MAX_FILE_BYTES",
    "validate_argv",
    "validate_count",
    "validate_env",
    "validate_path",
    "validate_sweep",
    "validate_tags",
    "validate_timeout",
]

MAX_ARGV_BYTES = 1024 * 1024
MAX_FILE_BYTES = 256 * 1024 * 1024
_TAG_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:=/-]{0,127}$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _no_nul(value: str, what: str) -> None:
    if "\x00" in value:
        raise SandboxValidationError(f"{what} contains a NUL byte")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise SandboxValidationError(f"{what} is not valid Unicode (it contains a lone surrogate)") from None


@overload
def validate_timeout(value: object, what: str = ..., *, default: float, allow_inf: bool = ...) -> float: ...


@overload
def validate_timeout(
    value: object, what: str = ..., *, allow_none: bool = ..., allow_inf: bool = ...
) -> float | None: ...


def validate_timeout(
    value: object,
    what: str = "timeout_seconds",
    *,
    allow_none: bool = False,
    default: float | None = None,
    allow_inf: bool = False,
) -> float | None:
    """A positive number of seconds, by the library's one rule for timeouts.

    ``None`` means the default: ``default`` if given, else ``None`` when
    ``allow_none`` (an optional deadline left unset), else it is an error.
    ``0``, negatives, NaN, bools and non-numbers raise ``SandboxValidationError``;
    ``math.inf`` ("no limit") only with ``allow_inf``.
    """
    if value is None:
        if default is not None:
            return default
        if allow_none:
            return None
        raise SandboxValidationError(f"{what} is required")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SandboxValidationError(f"{what} must be a number of seconds, got {type(value).__name__}")
    if math.isnan(value) or value <= 0 or (math.isinf(value) and not allow_inf):
        finite = "" if allow_inf else ", finite"
        raise SandboxValidationError(f"{what} must be a positive{finite} number of seconds, got {value!r}")
    return float(value)


def validate_count(value: object, what: str, *, default: int | None = None) -> int:
    """A positive int (``None`` means ``default``); anything else raises ``SandboxValidationError``."""
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SandboxValidationError(f"{what} must be a positive int, got {value!r}")
    return value


def validate_number(value: object, what: str, *, integer: bool = False, allow_zero: bool = False) -> None:
    """A finite number (a whole one with ``integer``), > 0 (>= 0 with ``allow_zero``), for backend options."""
    ok_type = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, ok_type) or not math.isfinite(value):
        raise SandboxValidationError(f"{what} must be a {'whole' if integer else 'finite'} number, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise SandboxValidationError(f"{what} must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")


def validate_optional_str(value: object, what: str) -> None:
    """None or a non-empty str, for backend options."""
    if value is not None and (not isinstance(value, str) or not value):
        raise SandboxValidationError(f"{what} must be a non-empty str or None, got {value!r}")


def validate_option_names(options: Mapping[str, Any], known: Iterable[str], what: str) -> None:
    """``SandboxValidationError`` naming every key of ``options`` not in ``known`` (``what``: whose options)."""
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise SandboxValidationError(f"unknown {what} option(s): {', '.join(unknown)}")


def validate_path(path: object, what: str = "path") -> str:
    """An absolute POSIX path without NUL bytes; returned normalised (``..`` resolved lexically)."""
    if not isinstance(path, str):
        raise SandboxValidationError(f"{what} must be a str, got {type(path).__name__}")
    if not path:
        raise SandboxValidationError(f"{what} is empty")
    _no_nul(path, what)
    if not path.startswith("/"):
        raise SandboxValidationError(f"{what} must be absolute, got {path!r}")
    if len(path.encode()) > 4096:
        raise SandboxValidationError(f"{what} is longer than 4096 bytes")
    norm = posixpath.normpath(path)
    if norm.startswith("//"):
        norm = "/" + norm.lstrip("/")
    return norm


def validate_env(env: object, what: str = "env") -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise SandboxValidationError(f"{what} must be a mapping of str to str")
    out: dict[str, str] = {}
    for key, value in env.items():
        if not isinstance(key, str) or not _ENV_NAME_RE.match(key):
            raise SandboxValidationError(f"{what} has an invalid variable name: {key!r}")
        if not isinstance(value, str):
            raise SandboxValidationError(f"{what}[{key!r}] must be a str, got {type(value).__name__}")
        _no_nul(value, f"{what}[{key!r}]")
        out[key] = value
    return out


def validate_tags(tags: object) -> tuple[str, ...]:
    if isinstance(tags, str):
        raise SandboxValidationError("tags must be a sequence of str, not a bare str (did you mean (tag,)?)")
    if not isinstance(tags, Sequence):
        raise SandboxValidationError("tags must be a sequence of str")
    for tag in tags:
        if not isinstance(tag, str) or not _TAG_RE.match(tag):
            raise SandboxValidationError(
                f"invalid tag {tag!r}: 1-128 characters of letters, digits and _.:=/- , starting alphanumeric"
            )
    return tuple(tags)


def validate_argv(command: object) -> tuple[str, ...]:
    """A command as argv: a list of str, or a str run with ``/bin/sh -c``; at most ``MAX_ARGV_BYTES``."""
    if isinstance(command, str):
        if not command.strip():
            raise SandboxValidationError("command is empty")
        _no_nul(command, "command")
        return ("/bin/sh", "-c", command)
    if isinstance(command, (bytes, bytearray)) or not isinstance(command, Sequence):
        raise SandboxValidationError("command must be a list of str (or a str, run with sh -c)")
    argv = tuple(command)
    if not argv:
        raise SandboxValidationError("command is empty")
    total = 0
    for i, arg in enumerate(argv):
        if not isinstance(arg, str):
            raise SandboxValidationError(f"command[{i}] must be a str, got {type(arg).__name__}")
        _no_nul(arg, f"command[{i}]")
        total += len(arg.encode()) + 1
    if not argv[0]:
        raise SandboxValidationError("command[0] is empty")
    if total > MAX_ARGV_BYTES:
        raise SandboxValidationError(
            f"command is {total} bytes; at most {MAX_ARGV_BYTES} (pass large input through stdin or a file)"
        )
    return argv


def validate_file_data(data: object, path: str) -> bytes:
    if isinstance(data, str):
        try:
            data = data.encode("utf-8")
        except UnicodeEncodeError:
            raise SandboxValidationError(f"data for {path} is not valid Unicode (a lone surrogate)") from None
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise SandboxValidationError(f"data for {path} must be bytes or str, got {type(data).__name__}")
    if len(data) > MAX_FILE_BYTES:
        raise SandboxValidationError(f"data for {path} is {len(data)} bytes; at most {MAX_FILE_BYTES}")
    return bytes(data)


def validate_share(value: object, name: str, *, upper: float) -> float:
    """A finite number in ``[0, upper]`` (a fraction, or a ratio when ``upper`` is infinite)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= upper:
        bound = "a finite number >= 0" if math.isinf(upper) else f"a number in [0, {upper:g}]"
        raise SandboxValidationError(f"{name} must be {bound}, got {value!r}")
    if not math.isfinite(value):
        raise SandboxValidationError(f"{name} must be finite, got {value!r}")
    return float(value)


def validate_cpu_seconds(value: object) -> float | None:
    """A per-exec CPU-time budget: ``None`` (no budget) or a positive finite number of seconds."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise SandboxValidationError(f"cpu_seconds must be a positive number of seconds or None, got {value!r}")
    return float(value)


def validate_sweep(
    tags: object, older_than_seconds: object, *, needs: str = "tags or older_than_seconds"
) -> tuple[tuple[str, ...], float | None]:
    """The one guard of every sweep: ``(tags, older_than_seconds)`` checked, and at least one of them given,
    so a sweep cannot stop everything by accident (``SandboxValidationError`` otherwise; ``needs`` names
    the two in the caller's words)."""
    wanted = validate_tags(tags)
    min_age = validate_timeout(older_than_seconds, "older_than_seconds", allow_none=True)
    if not wanted and min_age is None:
        raise SandboxValidationError(f"sweep needs {needs}, so it cannot stop everything by accident")
    return wanted, min_age
