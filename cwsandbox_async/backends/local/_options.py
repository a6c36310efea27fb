"""LocalBackend's settings and option checks, and its mapping from ``Resources`` to rlimits (see ``_backend``)."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

from ..._errors import SandboxValidationError
from ..._types import Resources
from ..._validate import validate_option_names

__all__ = [
    "AGENT_KINDS",
    "ISOLATION_LEVELS",
    "MIB",
    "PIDS_OVERHEAD",
    "LocalOptions",
    "check_options",
    "rlimits_for",
]


_DEFAULTS = {
    "exit_grace_seconds": 0.5,
    "eof_grace_seconds": 1.0,
    "exit_status_wait_seconds": 30.0,
    "plain_file_timeout_seconds": 60.0,
}


@dataclass(frozen=True)
class LocalOptions:
    """The local backend's timeouts and budgets, in seconds. ``None`` means the default shown.

    Every wait the backend does is also bounded by its caller's deadline (``Session`` timeouts):
    these settings only decide when the backend escalates, never extend a caller's budget.

    - ``exit_grace_seconds`` (0.5): how long ``destroy`` lets the agent exit by itself (killing
      its commands) before it SIGKILLs it, where the agent is not PID 1 of the sandbox
      (``isolation="none"``); a template-born sandbox is SIGKILLed at once (the kernel then kills
      everything in its pid namespace).
    - ``eof_grace_seconds`` (1.0): after the sandbox reported an exec's end (its whole process
      tree is gone), how long the driver waits for its output pipes to reach end of file (a
      process of the sandbox may still hold one open) before it stops reading them.
    - ``exit_status_wait_seconds`` (30.0): how long a call that found its sandbox dead waits at most
      for the evidence of how the sandbox's first process ended (its wait status, there once the
      template reaped it: milliseconds, later on a stalled machine), which says whose failure it is;
      past it the death is unknown, the program's (``infrastructure=False``), and a WARNING says so.
      A hang guard, not a verdict's timing.
    - ``plain_file_timeout_seconds`` (60.0): the timeout of the ``cat`` that reads or writes a
      file on the plain exec path (no agent).

    Each must be > 0 (``math.inf`` allowed where "never" makes sense); 0, a negative or NaN raises
    ``SandboxValidationError``.
    """

    exit_grace_seconds: float | None = None
    eof_grace_seconds: float | None = None
    exit_status_wait_seconds: float | None = None
    plain_file_timeout_seconds: float | None = None

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value <= 0:
                raise SandboxValidationError(f"{f.name} must be a number > 0 (or None for the default); got {value!r}")

    def with_settings(self, **settings: float | None) -> LocalOptions:
        """A copy with ``settings`` (field names) replaced; ``SandboxValidationError`` for unknown names."""
        validate_option_names(settings, (f.name for f in dataclasses.fields(self)), "LocalBackend")
        return dataclasses.replace(self, **settings) if settings else self

    def _get(self, name: str) -> float:
        value = getattr(self, name)
        return float(_DEFAULTS[name] if value is None else value)

    @property
    def exit_grace(self) -> float:
        return self._get("exit_grace_seconds")

    @property
    def eof_grace(self) -> float:
        return self._get("eof_grace_seconds")

    @property
    def exit_status_wait(self) -> float:
        return self._get("exit_status_wait_seconds")

    @property
    def plain_file_timeout(self) -> float:
        return self._get("plain_file_timeout_seconds")


ISOLATION_LEVELS = ("auto", "bwrap", "unshare", "none")
AGENT_KINDS = ("auto", "python", "plain")
#: Processes the sandbox's own machinery may use on top of ``Resources.pids`` (its PID 1, file
#: helpers, and bwrap on the plain path).
PIDS_OVERHEAD = 4
MIB = 1024 * 1024


def check_options(
    isolation: object,
    agent: object,
    host_uid: object,
    sandbox_uid: object,
    sandbox_gid: object,
    paths: Sequence[object],
    cpu_weight: object = None,
) -> None:
    """Raise ``SandboxValidationError`` for any bad ``LocalBackend`` option."""
    if cpu_weight is not None and (
        isinstance(cpu_weight, bool) or not isinstance(cpu_weight, int) or not 1 <= cpu_weight <= 10000
    ):
        raise SandboxValidationError(f"cpu_weight must be an int from 1 to 10000 (or None); got {cpu_weight!r}")
    if isolation not in ISOLATION_LEVELS:
        raise SandboxValidationError(f"isolation must be one of {', '.join(ISOLATION_LEVELS)}; got {isolation!r}")
    if agent not in AGENT_KINDS:
        raise SandboxValidationError(f"agent must be one of {', '.join(AGENT_KINDS)}; got {agent!r}")
    if (agent == "plain" and isolation == "unshare") or (agent == "python" and isolation == "bwrap"):
        raise SandboxValidationError(
            "the agent runs in template-born sandboxes (isolation='unshare'); with isolation='bwrap' every exec "
            f"is its own bwrap and there is no agent (agent='plain'); got isolation={isolation!r}, agent={agent!r}"
        )
    if host_uid != "auto" and host_uid is not None and (isinstance(host_uid, bool) or not isinstance(host_uid, int)):
        raise SandboxValidationError("host_uid must be 'auto', None or a positive int")
    if isinstance(host_uid, int) and (host_uid <= 0 or os.geteuid() != 0):
        raise SandboxValidationError("host_uid must be a positive int, and can only be chosen as root")
    for value, what in ((sandbox_uid, "sandbox_uid"), (sandbox_gid, "sandbox_gid")):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise SandboxValidationError(f"{what} must be a positive int (not 0: the sandbox is never root)")
    for path in paths:
        if not isinstance(path, str) or not path.startswith("/") or "\x00" in path or path.rstrip("/") == "":
            raise SandboxValidationError(f"expose/hide entries must be absolute paths other than /: {path!r}")


def rlimits_for(
    res: Resources, by_cgroup: dict[str, str], host_root: bool, tmpfs: bool
) -> tuple[dict[str, int], dict[str, str]]:
    """The rlimits every command gets, and what enforces each limit (cgroup entries given)."""
    enforced = dict(by_cgroup)
    rl: dict[str, int] = {}
    if res.cpu_seconds:
        rl["cpu"] = int(res.cpu_seconds)
        enforced["cpu_seconds"] = "rlimit"
    if res.file_size_mib:
        rl["fsize"] = int(res.file_size_mib * MIB)
        enforced["file_size"] = "rlimit"
    if res.pids and "pids" not in enforced:
        rl["nproc"] = int(res.pids) + PIDS_OVERHEAD
        enforced["pids"] = "none (RLIMIT_NPROC does not bind host root)" if host_root else "rlimit"
    if res.memory_mib and "memory" not in enforced:
        rl["as"] = int(res.memory_mib * MIB)
        enforced["memory"] = "rlimit"
    if tmpfs:
        enforced.update(tmp="tmpfs", workspace="tmpfs")
    return rl, enforced
