"""Specs, results and enums: frozen dataclasses shared by every layer."""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ._errors import SandboxValidationError
from ._sdk import DEFAULTS_ALIASES, resolve_aliases
from ._validate import validate_env, validate_path, validate_share, validate_tags, validate_timeout

__all__ = [
    "DEFAULT_WORKING_DIR",
    "ExecExit",
    "ExecOutcome",
    "ExecRequest",
    "ExecResult",
    "Resources",
    "SandboxDefaults",
    "SandboxInfo",
    "SandboxSpec",
    "SandboxStatus",
    "StreamName",
]

DEFAULT_WORKING_DIR = "/workspace"
StreamName = Literal["stdout", "stderr"]


class SandboxStatus(enum.StrEnum):
    """Lifecycle of a sandbox, with the CoreWeave SDK's names."""

    CREATING = "creating"
    RUNNING = "running"
    TERMINATING = "terminating"
    COMPLETED = "completed"
    FAILED = "failed"

    @property
    def is_terminal(self) -> bool:
        return self in (SandboxStatus.COMPLETED, SandboxStatus.FAILED)


class ExecOutcome(enum.StrEnum):
    """How one exec ended, as counted in ``exec_stats`` and the metrics."""

    COMPLETED_OK = "completed_ok"
    COMPLETED_NONZERO = "completed_nonzero"
    FAILURE = "failure"


@dataclass(frozen=True, slots=True)
class Resources:
    """Limits for one sandbox. ``None`` means the backend's default.

    - ``cpu``: cores (a CFS quota locally, the pod limit on Kubernetes).
    - ``memory_mib``: memory limit; exceeding it kills the offending process.
    - ``pids``: processes and threads alive at once (contains fork bombs).
    - ``cpu_seconds``: CPU time per exec (RLIMIT_CPU).
    - ``file_size_mib``: largest file a process may write (RLIMIT_FSIZE).
    - ``tmp_mib`` / ``workspace_mib``: size of the writable /tmp and workspace.
    """

    cpu: float | None = None
    memory_mib: int | None = 1024
    pids: int | None = 256
    cpu_seconds: int | None = None
    file_size_mib: int | None = 256
    tmp_mib: int | None = 256
    workspace_mib: int | None = 512


@dataclass(frozen=True, slots=True)
class SandboxDefaults:
    """Defaults for every sandbox a Session creates; override per sandbox.

    ``image`` is used by backends that run container images (Kubernetes, CoreWeave).
    The local backend has no images: it runs the host's root file system read-only,
    and rejects nothing, but logs that the image is ignored when one is given.
    ``container_image=`` (the CoreWeave SDK's name) is accepted for ``image``, here and
    in ``with_overrides``; giving both with different values raises
    ``SandboxValidationError``.
    """

    image: str | None = None
    resources: Resources = field(default_factory=Resources)
    env: Mapping[str, str] = field(default_factory=dict)
    tags: tuple[str, ...] = ()
    working_dir: str = DEFAULT_WORKING_DIR
    max_lifetime_seconds: float | None = 3600.0
    exec_timeout_seconds: float = 60.0
    max_output_bytes: int = 16 * 1024 * 1024
    network: bool = False
    create_timeout_seconds: float = 120.0
    operation_timeout_seconds: float = 30.0
    #: The CoreWeave SDK's name for ``image`` (an init-only alias: read ``image``).
    container_image: dataclasses.InitVar[str | None] = None
    #: Starvation thresholds (docs/outcomes.md): a timed-out exec is "starved" -- the platform's
    #: fault, raised as an infrastructure ``SandboxTimeoutError`` -- only if the command and
    #: everything else in its sandbox used less than ``starved_cpu_share`` of the CPU it was
    #: entitled to (``min(1, resources.cpu)`` cores) **and** its processes waited in the run queue
    #: for at least ``starved_wait_share`` of its wall time. ``starved_cpu_share=0`` turns it off.
    starved_cpu_share: float = 0.5
    starved_wait_share: float = 0.25

    def __post_init__(self, container_image: str | None) -> None:
        values: dict[str, Any] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if container_image is not None:
            values["container_image"] = container_image
        for name, value in _checked_overrides(self, values).items():
            object.__setattr__(self, name, value)

    def with_overrides(self, **overrides: Any) -> SandboxDefaults:
        """A copy with the given fields replaced; ``tags`` and ``env`` are merged."""
        overrides = _checked_overrides(self, overrides)
        if "tags" in overrides:
            merged = dict.fromkeys((*self.tags, *overrides["tags"]))
            overrides["tags"] = tuple(merged)
        if "env" in overrides:
            overrides["env"] = {**self.env, **overrides["env"]}
        return dataclasses.replace(self, **overrides)


@dataclass(frozen=True, slots=True)
class SandboxSpec:
    """Everything a backend needs to create one sandbox (resolved, validated)."""

    sandbox_id: str
    session_id: str
    defaults: SandboxDefaults


@dataclass(frozen=True, slots=True)
class SandboxInfo:
    """A sandbox as ``list`` finds it, possibly left by another (crashed) process."""

    sandbox_id: str
    tags: tuple[str, ...]
    status: SandboxStatus
    created_at: float
    session_id: str | None = None
    owner_pid: int | None = None
    owner_alive: bool | None = None
    backend: str = ""
    #: ``list`` found its owner process gone and destroyed what was left of it (processes, cgroups,
    #: registry entry) before returning: this is the last time it is listed.
    reaped: bool = False


@dataclass(frozen=True, slots=True)
class ExecRequest:
    """One command for a backend to run (already validated)."""

    argv: tuple[str, ...]
    cwd: str
    env: Mapping[str, str]
    stdin: bytes | None
    timeout_seconds: float
    max_output_bytes: int
    #: CPU-time budget for the command's whole process tree, enforced by the sandbox
    #: (``None``: no budget beyond ``Resources.cpu_seconds``). Exceeding it ends the
    #: command with ``ExecExit.cpu_exceeded``: the program's own outcome.
    cpu_seconds: float | None = None
    #: Before the command starts, every other process in the sandbox is killed, so
    #: nothing else can write into its output, signal it or trace it.
    exclusive: bool = False
    #: While the command runs, its sandbox gets the CPU before the other sandboxes of this
    #: machine, where the backend can give it (the local backend: the sandbox cgroup's CPU
    #: weight, raised by the driver and lowered again when the exec ends; a backend without
    #: such a mechanism runs the command at its usual share). Only with ``exclusive`` and a
    #: ``cpu_seconds`` budget (``validate_exec``): nothing else of the sandbox rides on the
    #: priority, and the command takes at most its budget of CPU with it.
    cpu_priority: bool = False


@dataclass(frozen=True, slots=True)
class ExecExit:
    """What a backend reports when a command ends.

    ``returncode`` follows ``subprocess``: negative means killed by that signal.
    ``timed_out`` means the backend killed the process tree at the deadline;
    ``truncated`` means output beyond ``max_output_bytes`` was dropped (and the
    command was killed, since nothing would read the rest).

    The facts a verdict is decided on, each reported only where the backend can
    tell (otherwise the default):

    - ``cpu_seconds``: CPU time of the command's whole process tree.
    - ``oom_killed``: the kernel's OOM killer killed a process of this command
      (read from the sandbox's memory cgroup, or the container status).
    - ``cpu_exceeded``: the command was killed for exceeding its CPU budget.
    - ``cpu_wait_seconds``: time the command's processes were runnable but waiting
      for a CPU (run-queue delay), as wall time (processes that waited together
      count once: never more than ``wall_seconds``); ``None`` when the backend
      cannot measure it.
      The Sandbox layer uses it to tell a starved timeout from the program's own.
    - ``sandbox_cpu_seconds``: CPU time of everything in the sandbox during the
      command (its cgroup's usage), so CPU burnt by processes outside the
      command's tree (daemons it left, other execs) counts; ``None`` when unknown.
    - ``others_cpu_seconds``: CPU time everything outside the sandbox used on the
      machine during the command, measured outside the sandbox (the local backend:
      the host's busy time minus the sandbox cgroup's); ``None`` when unknown. A
      timeout is starved only with this evidence that others held the CPUs.
    """

    returncode: int
    stdout: bytes
    stderr: bytes
    wall_seconds: float
    cpu_seconds: float = 0.0
    timed_out: bool = False
    truncated: bool = False
    oom_killed: bool = False
    cpu_exceeded: bool = False
    cpu_wait_seconds: float | None = None
    sandbox_cpu_seconds: float | None = None
    others_cpu_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class ExecResult:
    """The result of one exec. A non-zero exit is a result, not an exception.

    ``stdout``/``stderr`` are decoded as UTF-8 with replacement, once, from the
    whole output; the raw bytes are ``stdout_bytes``/``stderr_bytes``.
    """

    command: tuple[str, ...]
    returncode: int
    stdout_bytes: bytes
    stderr_bytes: bytes
    wall_seconds: float
    cpu_seconds: float
    truncated: bool = False
    timed_out: bool = False
    sandbox_id: str | None = None
    oom_killed: bool = False
    cpu_exceeded: bool = False
    cpu_wait_seconds: float | None = None
    #: The wall timeout fired while the command was starved of CPU by others: the
    #: platform's fault, not the program's (see ``SandboxTimeoutError.infrastructure``).
    starved: bool = False
    sandbox_cpu_seconds: float | None = None

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode("utf-8", errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_bytes.decode("utf-8", errors="replace")

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    @property
    def signal(self) -> int | None:
        """The signal that killed the command, if one did."""
        return -self.returncode if self.returncode < 0 else None

    @classmethod
    def from_exit(
        cls, command: tuple[str, ...], ex: ExecExit, sandbox_id: str | None, *, starved: bool = False
    ) -> ExecResult:
        return cls(
            command=command,
            returncode=ex.returncode,
            stdout_bytes=ex.stdout,
            stderr_bytes=ex.stderr,
            wall_seconds=ex.wall_seconds,
            cpu_seconds=ex.cpu_seconds,
            truncated=ex.truncated,
            timed_out=ex.timed_out,
            sandbox_id=sandbox_id,
            oom_killed=ex.oom_killed,
            cpu_exceeded=ex.cpu_exceeded,
            cpu_wait_seconds=ex.cpu_wait_seconds,
            starved=starved,
            sandbox_cpu_seconds=ex.sandbox_cpu_seconds,
        )


def _checked_resources(res: object) -> Resources:
    if isinstance(res, Mapping):
        try:
            res = Resources(**res)
        except TypeError as exc:
            raise SandboxValidationError(f"invalid resources: {exc}") from None
    if not isinstance(res, Resources):
        raise SandboxValidationError("resources must be a Resources or a mapping")
    for f in dataclasses.fields(res):
        v = getattr(res, f.name)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0 or math.isinf(v) or math.isnan(v):
            raise SandboxValidationError(f"resources.{f.name} must be a positive number or None, got {v!r}")
    return res


def _checked_overrides(base: SandboxDefaults, overrides: dict[str, Any]) -> dict[str, Any]:
    """Validate ``SandboxDefaults`` fields given as keyword overrides (``container_image`` becomes ``image``)."""
    names = {f.name for f in dataclasses.fields(base)}
    unknown = sorted(set(overrides) - names - set(DEFAULTS_ALIASES))
    if unknown:
        raise SandboxValidationError(f"unknown sandbox option(s): {', '.join(unknown)}")
    overrides = resolve_aliases(overrides)
    out = dict(overrides)
    for key, value in overrides.items():
        if key == "tags":
            out[key] = validate_tags(value)
        elif key == "env":
            out[key] = validate_env(value)
        elif key == "working_dir":
            out[key] = validate_path(value, "working_dir")
        elif key == "resources":
            out[key] = _checked_resources(value)
        elif key == "max_lifetime_seconds":
            out[key] = validate_timeout(value, key, allow_none=True)
        elif key in ("exec_timeout_seconds", "create_timeout_seconds", "operation_timeout_seconds"):
            out[key] = validate_timeout(value, key)
        elif key == "max_output_bytes":
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise SandboxValidationError(f"max_output_bytes must be a positive int, got {value!r}")
        elif key == "network":
            if not isinstance(value, bool):
                raise SandboxValidationError("network must be a bool")
        elif key in ("starved_cpu_share", "starved_wait_share"):
            out[key] = validate_share(value, key, upper=1.0 if key == "starved_cpu_share" else math.inf)
        elif key == "image" and value is not None and (not isinstance(value, str) or not value):
            raise SandboxValidationError("image must be a non-empty str or None")
    return out
