"""LocalBackend's option checks and its mapping from ``Resources`` to rlimits (see ``_backend``)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from ..._errors import SandboxValidationError
from ..._types import Resources

__all__ = ["AGENT_KINDS", "ISOLATION_LEVELS", "MIB", "PIDS_OVERHEAD", "check_options", "rlimits_for"]

ISOLATION_LEVELS = ("auto", "bwrap", "unshare", "none")
AGENT_KINDS = ("auto", "python", "plain")
#: Processes the sandbox's own machinery may use on top of ``Resources.pids`` (bwrap, the agent,
#: one worker per concurrent exec, up to 8 idle ones).
PIDS_OVERHEAD = 16
MIB = 1024 * 1024


def check_options(
    isolation: object,
    agent: object,
    host_uid: object,
    sandbox_uid: object,
    sandbox_gid: object,
    paths: Sequence[object],
) -> None:
    """Raise ``SandboxValidationError`` for any bad ``LocalBackend`` option."""
    if isolation not in ISOLATION_LEVELS:
        raise SandboxValidationError(f"isolation must be one of {', '.join(ISOLATION_LEVELS)}; got {isolation!r}")
    if agent not in AGENT_KINDS or (agent == "plain" and isolation not in ("auto", "bwrap")):
        raise SandboxValidationError(f"agent must be one of {', '.join(AGENT_KINDS)} (plain needs bwrap)")
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
