"""The CoreWeave SDK's names, kept in one place so the core types stay in the library's own words.

Code written against the ``cwsandbox`` SDK keeps working: ``container_image=`` for
``SandboxDefaults.image``, the SDK's sandbox statuses in ``Session.list(status=...)``,
and the SDK's ``exec_stats`` keys (each count once, under the SDK's name). Two aliases cannot live
here and stay beside what they name: the property ``SandboxFileError.filepath`` and the
public name ``ProcessResult`` (``ExecResult``). Nothing here imports the library's
types: each alias maps to a plain name the core resolves.
"""

from __future__ import annotations

from typing import Any

from ._errors import SandboxValidationError

__all__ = ["DEFAULTS_ALIASES", "STATUS_ALIASES", "exec_stats", "resolve_aliases"]

#: ``SandboxDefaults`` fields under their SDK names: SDK name -> the field it stands for.
DEFAULTS_ALIASES = {"container_image": "image"}

#: The SDK's statuses this library folds into one of its own (``SandboxStatus`` values).
STATUS_ALIASES = {
    "pending": "creating",
    "preparing": "creating",
    "paused": "running",
    "terminated": "completed",
}


def resolve_aliases(overrides: dict[str, Any]) -> dict[str, Any]:
    """``overrides`` with every SDK name replaced by its field; ``SandboxValidationError`` if both are
    given and disagree."""
    if not DEFAULTS_ALIASES.keys() & overrides.keys():
        return overrides
    out = dict(overrides)
    for alias, name in DEFAULTS_ALIASES.items():
        if alias in out:
            value = out.pop(alias)
            if out.get(name) not in (None, value):
                raise SandboxValidationError(f"{name} and {alias} (its SDK name) disagree; give one")
            out[name] = value
    return out


def exec_stats(count: int, ok: int, nonzero: int, failures: int) -> dict[str, int]:
    """Per-sandbox exec counters under the CoreWeave SDK's keys (``Sandbox.exec_stats``), each once."""
    return {
        "exec_count": count,
        "exec_completed_ok": ok,
        "exec_completed_nonzero": nonzero,
        "exec_failures": failures,
    }
