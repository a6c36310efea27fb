"""What every way of running a local sandbox implements (``Runner``), and what they share.

The backend holds one ``Runner`` per sandbox (in its ``Box``) and calls only this interface, so no
operation asks which kind of sandbox it is. ``Machine`` is what the runners of one backend share:
its options, registry, cgroups, host uids and worker threads, and the settings every sandbox's
layout, registry entry and limits are made from. ``AgentRunner`` is what the runners whose sandbox
has an agent (born from the template, or on the host) share: its execs and file calls.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

from ...._errors import SandboxCreationError, SandboxNotRunningError
from ...._types import ExecExit, ExecRequest, SandboxSpec
from ....images import ImageOptions
from ...base import OutputCallback
from .._bwrap import Layout
from .._cgroup import CgroupManager, SandboxCgroup
from .._channel import AgentChannel
from .._host_uids import HostIds
from .._link import Link
from .._options import MIB, PIDS_OVERHEAD, LocalOptions, rlimits_for
from .._probe import Probe
from .._registry import Registry
from .._threads import Blocking

__all__ = ["SAFE_PATH_ENV", "AgentRunner", "BaseRunner", "Machine", "Runner", "agent_start_error"]

#: What every ``run_python`` program's environment starts from (the sandbox's and the request's win).
SAFE_PATH_ENV = {"PYTHONSAFEPATH": "1"}


class Runner(Protocol):
    """One way a local sandbox runs. ``start`` once; the calls only after it returned; ``teardown``
    whatever happened before (a failed or cancelled ``start`` too), once."""

    #: The host pid of the sandbox's first process (None: it has none, or not known yet).
    pid: int | None
    #: The host uid its processes run as (None: this process's).
    host_uid: int | None
    cgroup: SandboxCgroup | None

    async def start(self) -> dict[str, str]:
        """Start the sandbox; returns what enforces each limit (``LocalBackend.limits``).
        ``SandboxCreationError`` (or ``OSError``) when it cannot start."""
        ...

    def failure(self) -> SandboxNotRunningError | None:
        """The error every call gets once the sandbox died under us (whose failure it was); None while it lives."""
        ...

    async def exec(self, request: ExecRequest, on_output: OutputCallback | None) -> ExecExit: ...

    async def run_python(self, source: str, request: ExecRequest, on_output: OutputCallback | None) -> ExecExit:
        """As ``python3 -c source`` with ``PYTHONSAFEPATH=1`` unless the request's env sets it."""
        ...

    async def read(self, path: str, max_bytes: int) -> bytes: ...

    async def write(self, path: str, data: bytes) -> None: ...

    async def teardown(self) -> None:
        """Stop the sandbox and release everything it holds; bounded by the caller's deadline."""
        ...


@dataclass(frozen=True)
class Machine:
    """What the runners of one ``LocalBackend`` share (see the module docstring)."""

    options: LocalOptions
    registry: Registry
    cgroups: CgroupManager
    ids: HostIds
    blocking: Blocking
    #: This process's identity in registry entries (its start time).
    owner_start: int | None
    #: The ids seen inside a sandbox.
    uid: int
    gid: int
    expose: tuple[str, ...]
    hide: tuple[str, ...]
    #: The agent's interpreter, the prefix it lives under, the modules it preloads.
    python: str
    python_prefix: str | None
    preload: tuple[str, ...]
    #: Where images come from and are cached (``_image_run``).
    image_options: ImageOptions | None = None
    #: Images this backend resolved, by reference (``_image_run.prepare``: later creates skip the pull).
    image_memo: dict[str, Any] = field(default_factory=dict)
    #: This backend's own identity in registry entries (``owner_token``): which of the backends of one
    #: process owns a sandbox (``_attach``'s adopt rewrites it).
    owner_token: str = field(default_factory=lambda: uuid.uuid4().hex)

    def layout(self, spec: SandboxSpec, tmp_host: str | None = None, workspace_host: str | None = None) -> Layout:
        d = spec.defaults
        res = d.resources
        return Layout(
            hostname=spec.sandbox_id,
            working_dir=d.working_dir,
            tmp_bytes=int(res.tmp_mib * MIB) if res.tmp_mib else None,
            workspace_bytes=int(res.workspace_mib * MIB) if res.workspace_mib else None,
            network=d.network,
            uid=self.uid,
            gid=self.gid,
            extra_expose=self.expose,
            hide=self.hide,
            python_prefix=self.python_prefix,
            tmp_host=tmp_host,
            workspace_host=workspace_host,
        )

    def entry(
        self,
        spec: SandboxSpec,
        found: Probe,
        exe: str,
        created_at: float,
        host_uid: int | None,
        cgroup: SandboxCgroup | None,
        workspace: str | None,
    ) -> dict[str, Any]:
        """The sandbox's registry entry (see ``_registry``); no pid yet."""
        return {
            "sandbox_id": spec.sandbox_id,
            "session_id": spec.session_id,
            "tags": list(spec.defaults.tags),
            "created_at": created_at,
            "owner_pid": os.getpid(),
            "owner_start": self.owner_start,
            "owner_token": self.owner_token,
            "pid": None,
            "pid_start": None,
            "exe": exe,
            "isolation": found.level,
            "plain": found.plain,
            "host_uid": host_uid,
            "cgroups": list(cgroup.paths) if cgroup else [],
            "workspace": workspace,
            # What ``_attach`` needs to run commands as this sandbox's creator does (the directory is 0700).
            "defaults": {
                "working_dir": spec.defaults.working_dir,
                "env": dict(spec.defaults.env),
                "cpu_seconds": spec.defaults.resources.cpu_seconds,
            },
            "attach": False,
        }

    def rlimits(
        self, spec: SandboxSpec, cgroup: SandboxCgroup | None, host_uid: int | None, tmpfs: bool
    ) -> tuple[dict[str, int], dict[str, str]]:
        """Every command's rlimits, and what enforces each limit (``tmpfs``: /tmp and the workspace are sized tmpfs)."""
        by_cgroup = cgroup.enforced if cgroup else {}
        host_root = host_uid in (None, 0) and os.geteuid() == 0
        return rlimits_for(spec.defaults.resources, by_cgroup, host_root, tmpfs)

    def cgroup_limits(self, spec: SandboxSpec) -> dict[str, Any]:
        res = spec.defaults.resources
        return {
            "pids": res.pids + PIDS_OVERHEAD if res.pids else None,
            "memory_bytes": int(res.memory_mib * MIB) if res.memory_mib else None,
            "cpu": res.cpu,
        }

    def agent_config(self, spec: SandboxSpec, rlimits: dict[str, int]) -> dict[str, Any]:
        """PID 1's configuration (see ``agent.main``): numbers only, no request data, no environment."""
        d = spec.defaults
        return {
            "sandbox_id": spec.sandbox_id,
            "limits": rlimits,
            "file_limit": rlimits.get("fsize"),
            "ttl": d.max_lifetime_seconds,
            "cpus": d.resources.cpu,
            "die_with_parent": False,
        }


async def agent_start_error(link: Link, sandbox_id: str) -> SandboxCreationError:
    """The error of an agent that closed its channel before its hello: once it exited, with what it wrote."""
    await link.exited.wait()  # the agent closed its channel: it is exiting
    channel = link.channel
    tail = bytes(channel.stderr_tail).decode("utf-8", "replace").strip()
    return SandboxCreationError(
        f"sandbox {sandbox_id} failed to start: {channel.closed_reason}: {tail[-2000:]}",
        sandbox_id=sandbox_id,
        reason="agent_start",
    )


class BaseRunner(Runner):
    """What every runner holds from its construction: the spec, the backend's ``Machine``, the probe's
    findings, when it was made, and the process, uid and cgroup its ``start`` fills in."""

    def __init__(self, spec: SandboxSpec, machine: Machine, found: Probe) -> None:
        self.spec = spec
        self.machine = machine
        self.found = found
        self.created_at = time.time()
        self.pid: int | None = None
        self.host_uid: int | None = None
        self.cgroup: SandboxCgroup | None = None


class AgentRunner(BaseRunner):
    """What the runners whose sandbox has an agent (``born``, ``host``) share: the calls, through its
    channel (``_channel``, wired by ``link``). Each sets ``link`` when its agent's process exists and
    ``env`` and ``path_map`` before its ``start`` returns.

    ``env``: every exec's environment before its own (the sandbox's defaults); ``path_map``: sandbox
    path prefix -> host path, for an agent that sees the host's file system (``isolation="none"``)."""

    link: Link | None = None
    env: dict[str, str]
    path_map: tuple[tuple[str, str], ...] = ()
    #: The working directory an exec gets when it asked for the sandbox's default one (an image's
    #: ``WorkingDir``, see ``_image_run``); None: that default itself.
    default_cwd: str | None = None

    @property
    def channel(self) -> AgentChannel | None:
        """The agent's channel, once its process exists."""
        return self.link.channel if self.link is not None else None

    def _channel(self) -> AgentChannel:
        assert self.link is not None, "a call before start returned"
        return self.link.channel

    def map_path(self, path: str) -> str:
        """``path`` as the agent sees it (through ``path_map``)."""
        for inside, outside in self.path_map:
            if path == inside or path.startswith(inside.rstrip("/") + "/"):
                return outside + path[len(inside.rstrip("/")) :]
        return path

    def failure(self) -> SandboxNotRunningError | None:
        channel = self.channel
        return None if channel is None or channel.alive else channel.dead_error()

    def _cwd(self, request: ExecRequest) -> str:
        if self.default_cwd is not None and request.cwd == self.spec.defaults.working_dir:
            return self.default_cwd
        return self.map_path(request.cwd)

    async def exec(self, request: ExecRequest, on_output: OutputCallback | None) -> ExecExit:
        env = {**self.env, **request.env}
        return await self._channel().exec(request, env, self._cwd(request), None, on_output)

    async def run_python(self, source: str, request: ExecRequest, on_output: OutputCallback | None) -> ExecExit:
        """In a fork of the sandbox's PID 1, a clean warm interpreter."""
        # The working directory is not importable unless the caller asks (PYTHONSAFEPATH="" in env):
        # a json.py planted there by an earlier command would otherwise run at "import json".
        env = {**SAFE_PATH_ENV, **self.env, **request.env}
        return await self._channel().exec(request, env, self._cwd(request), source, on_output)

    async def read(self, path: str, max_bytes: int) -> bytes:
        return await self._channel().read_file(self.map_path(path), max_bytes, path)

    async def write(self, path: str, data: bytes) -> None:
        await self._channel().write_file(self.map_path(path), data, path)
