"""``BornRunner``: a local sandbox born from the template (the default path; see ``_template``).

A birth, in order (each step's failure leaves what ``teardown`` can undo, recorded on the runner):

1. ``Template.fork``: the template forks a newborn, which finds its birth configuration waiting
   (sent with the request) and enters its namespaces; meanwhile one worker-thread call writes the
   registry entry (no pid yet, the cgroups it is about to make), creates the sandbox's cgroups and
   opens the fds the newborn needs;
2. ``Template.deliver``: the newborn gets those fds and the agent's configuration, joins its
   cgroups, forks the sandbox's PID 1, which sends a pidfd of itself;
3. the channel is connected and the agent's hello awaited; meanwhile one worker-thread call writes
   the host pid (``pid``) and its start time into the entry, and sets PID 1's OOM score from
   the host (``hold_oom_score``) before any command exists.

Once PID 1 said hello it gets the sandbox's attach socket (``_attach``), bound beside the registry
entry while the hello was awaited.

``teardown``: unless another process adopted the sandbox (then only this process's channel closes),
SIGKILL through the pidfd (the sandbox's first process is PID 1 of its pid namespace, so
the kernel kills everything else in it), wait for the pidfd, remove the cgroups and the registry
entry in a worker thread. Nothing here opens a deadline of its own: the caller's scope bounds every
wait.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from ...._errors import SandboxCreationError
from ...._log import log
from ...._types import SandboxSpec
from .._attach_socket import bind_listener
from .._bwrap import sandbox_env, sandbox_mounts
from .._evidence import Evidence
from .._image_run import ImageRun, prepare
from .._leftover import kill_uid, remove_cgroup
from .._link import Link, ProcessHandles
from .._probe import Probe
from .._registry import proc_start_time
from .._template import MARKER, Template, pidfd_pid
from ..agent.protocol import MAX_BIRTH_CONFIG
from .base import AgentRunner, Machine, agent_start_error

__all__ = ["KEPT_HOLDS", "OOM_SCORE", "BornRunner", "hold_oom_score"]

#: Image holds of sandboxes another process adopted (``teardown``): kept until this process exits.
KEPT_HOLDS: list[contextlib.AsyncExitStack] = []

#: Every sandbox process's OOM score: a host out of memory kills sandboxes before anything else.
OOM_SCORE = 1000


def hold_oom_score(pid: int) -> bool:
    """Set PID 1's ``oom_score_adj`` from the host, so that no process of its sandbox can lower its own.

    Written by a process with ``CAP_SYS_RESOURCE`` (a root driver that was not denied it), the kernel
    also makes the value the process's floor (``oom_score_adj_min``), which every fork inherits: a
    command's ``echo 0 > /proc/self/oom_score_adj`` then fails with EACCES. A driver without that
    capability (not root, or a container that drops it) cannot set a floor: PID 1 still raises its
    own score to 1000 and its commands inherit it, but any of them may lower its own to the driver's
    floor. False when the write was refused."""
    try:
        with open(f"/proc/{pid}/oom_score_adj", "w") as f:
            f.write(str(OOM_SCORE))
    except OSError:
        return False
    return True


class BornRunner(AgentRunner):
    """A sandbox born from ``template`` (see the module docstring); a ``Runner``."""

    def __init__(
        self, spec: SandboxSpec, machine: Machine, found: Probe, template: Callable[[], Awaitable[Template]]
    ) -> None:
        super().__init__(spec, machine, found)
        #: The live template (started, or restarted after it died, by the backend's ``Setup``).
        self.live_template = template
        #: The sandbox's uid in the template's user namespace (released when its processes are gone).
        self.slot: int | None = None
        self.entry: dict[str, Any] = {}
        self.newborn: ProcessHandles | None = None
        self.env: dict[str, str] = {}
        #: ``time.monotonic()`` at the end of each step of its birth, the driver's.
        self.stamps: dict[str, float] = {}
        #: Set by ``teardown`` when another process had adopted the sandbox: it was left running.
        self.adopted_away = False
        #: The attach socket until PID 1 has it (``_attach``).
        self.listener: socket.socket | None = None
        #: Holds the image's layers in the cache while the sandbox lives (``_image_run``).
        self.image_hold = contextlib.AsyncExitStack()
        self.image: ImageRun | None = None

    async def start(self) -> dict[str, str]:
        """Birth the sandbox (see the module docstring); ``SandboxCreationError`` when it fails to start."""
        m, spec, d = self.machine, self.spec, self.spec.defaults
        sid = spec.sandbox_id
        template = await self.live_template()
        if d.image:
            assert m.image_options is not None
            self.image = await prepare(spec, m.image_options, self.image_hold, m.image_memo)
        self.slot, self.host_uid = m.ids.take(image=self.image is not None)
        self.entry = m.entry(spec, self.found, MARKER, self.created_at, self.host_uid, None, None)
        self.entry["marker"] = MARKER
        if self.image is not None:  # an attach runs commands as this sandbox does: the image's env and directory
            self.entry["defaults"].update(env=self.image.env, cwd=self.image.working_dir, image=True)
        birth = {
            "mkdirs": [p for p in (d.working_dir,) if not p.startswith("/tmp/")],
            "uid": self.slot,
            "gid": self.slot,
            "setgroups": m.ids.ranged,
            "inside_uid": m.uid,
            "inside_gid": m.gid,
            "network": d.network,
            "hostname": sid,
            "mounts": sandbox_mounts(m.layout(spec), workspace=self.image is None),
        }
        if self.image is not None:  # its root: the image's layers and a private upper (``agent/_imageroot``)
            workspace = m.layout(spec).workspace_bytes
            birth.update(mkdirs=[], inside_uid=self.image.uid, inside_gid=self.image.gid)
            birth["image"] = {"layers": self.image.layers, "upper_bytes": workspace, "mkdirs": self.image.mkdirs}
        self.stamps["start"] = time.monotonic()
        self.newborn = ProcessHandles()
        first = json.dumps(birth, separators=(",", ":")).encode()
        if len(first) > MAX_BIRTH_CONFIG:
            raise SandboxCreationError(f"sandbox {sid}: its configuration is too large", sandbox_id=sid)
        await template.fork(self.newborn, first)  # the newborn enters its namespaces while we make its cgroups
        self.stamps["fork_sent"] = time.monotonic()
        try:
            named = await m.blocking(self._prepare)
            self.stamps["prepared"] = time.monotonic()
        except OSError as exc:
            raise SandboxCreationError(f"sandbox {sid}: cannot prepare its cgroups: {exc}", sandbox_id=sid) from exc
        fds: list[int] = []
        index: dict[str, list[int]] = {}
        for name in ("join", "join_inside", "cmd_procs", "cmd_events", "sandbox_cpu"):
            index[name] = list(range(len(fds), len(fds) + len(named.get(name, []))))
            fds += named.get(name, [])
        # After the cgroups exist: the rlimits cover what they do not.
        rlimits, enforced = m.rlimits(spec, self.cgroup, self.host_uid, tmpfs=True)
        second = {
            "join": index["join"],
            "join_inside": index["join_inside"],
            "fds": {
                "cmd_procs": index["cmd_procs"],
                "cmd_events": index["cmd_events"][0] if index["cmd_events"] else None,
                "sandbox_cpu": index["sandbox_cpu"][0] if index["sandbox_cpu"] else None,
            },
            "agent": m.agent_config(spec, rlimits),
        }
        body = json.dumps(second, separators=(",", ":")).encode()
        try:
            if len(body) > MAX_BIRTH_CONFIG:
                raise SandboxCreationError(f"sandbox {sid}: its configuration is too large", sandbox_id=sid)
            await template.deliver(self.newborn, body, fds)
            self.stamps["born"] = time.monotonic()
        finally:
            for fd in fds:
                os.close(fd)
        self.link = link = Link(sid, self.newborn, m.blocking, m.options.eof_grace, m.options.exit_status_wait)
        channel = link.channel
        channel.evidence = Evidence(self.cgroup.cpu_usage if self.cgroup else None)
        channel.default_budget = float(d.resources.cpu_seconds or 0)
        await link.open()
        async with anyio.create_task_group() as tg:
            tg.start_soon(m.blocking, self._record_pid)  # off the critical path
            await channel.ready.wait()
            self.stamps["hello"] = time.monotonic()
        if channel.hello is None:
            raise await agent_start_error(link, sid)
        if self.listener is not None:  # PID 1 accepts attaches from now on (``_attach``)
            channel.listen(self.listener.detach())
            self.listener = None
        if self.image is not None:
            self.env, self.default_cwd = self.image.env, self.image.working_dir
        else:
            self.env = {**sandbox_env(d.working_dir), **d.env}
        self.stamps["running"] = time.monotonic()
        return enforced

    def _prepare(self) -> dict[str, list[int]]:
        """Worker thread: the registry entry, then the cgroups and their fds (module docstring, step 1).

        The entry comes first and names the groups about to be made, so a driver that dies in between
        leaves nothing that ``list``/``sweep`` cannot find."""
        m, sid = self.machine, self.spec.sandbox_id
        self.entry["cgroups"] = m.cgroups.planned(sid)
        m.registry.write(self.entry)
        if m.cgroups.available:
            self.cgroup = m.cgroups.create(sid, **m.cgroup_limits(self.spec))
        return self.cgroup.open_fds() if self.cgroup else {}

    def _record_pid(self) -> None:
        """Worker thread: the host pid of the sandbox's first process (from its pidfd) into the entry;
        its OOM score held (``hold_oom_score``)."""
        assert self.newborn is not None
        self.pid = self.newborn.pid = pidfd_pid(self.newborn.pidfd)
        if self.pid is not None:
            hold_oom_score(self.pid)
            self.entry.update(pid=self.pid, pid_start=proc_start_time(self.pid))
            try:
                self.listener = bind_listener(self.machine.registry, self.spec.sandbox_id)
                self.entry["attach"] = True
            except OSError as exc:  # the sandbox works; it cannot be attached to
                log.warning("sandbox cannot be attached to", sandbox_id=self.spec.sandbox_id, error=str(exc))
            self.machine.registry.write(self.entry)

    def _still_owner(self) -> bool:
        """Worker thread: whether the registry entry still names this process as the owner (another
        process's ``attach(adopt=True)`` rewrites it); a missing entry counts as ours."""
        entry = self.machine.registry.read(self.spec.sandbox_id)
        m = self.machine
        owner = (entry.get("owner_pid"), entry.get("owner_start"), entry.get("owner_token")) if entry else None
        return owner is None or owner == (os.getpid(), m.owner_start, m.owner_token)

    # -- teardown ----------------------------------------------------------------
    async def teardown(self) -> None:
        """``_stop``, then the image's hold on its layers goes, however the stop ended; unless another process
        adopted the sandbox, which still runs on them: then the hold stays until this process exits
        (``KEPT_HOLDS``), as the template does (``Setup.aclose``)."""
        try:
            await self._stop()
        finally:
            if self.adopted_away:
                KEPT_HOLDS.append(self.image_hold)
            else:
                await self.image_hold.aclose()  # its layers may be collected again

    async def _stop(self) -> None:
        """Stop the sandbox and release everything it holds (bounded by the caller).

        The sandbox's first process is PID 1 of its pid namespace: SIGKILL through its pidfd makes the
        kernel kill everything else in the sandbox, at once and without the agent's help, so there is
        no graceful exit to wait for. Then its cgroups and registry entry go, in one worker-thread
        call when the groups are empty at the first try (they are once PID 1 is gone: nothing is listed
        then; a leftover process is killed and waited for).
        """
        m = self.machine
        link = self.link
        gone = False
        if self.listener is not None:
            self.listener.close()
        if link is not None and self.entry.get("attach") and not await m.blocking(self._still_owner):
            link.close()  # adopted by another process (``_attach``): it stops the sandbox, and owns its uid
            self.adopted_away = True
            return
        if link is not None:
            link.channel.terminating = True
            link.kill()
            await link.exited.wait()
            link.close()
            gone = True
        elif self.newborn is not None:
            self.newborn.close()  # a newborn without a channel yet reads EOF and exits
        sid = self.spec.sandbox_id
        cg = self.cgroup

        def finish() -> bool:
            # PID 1 has exited, so the kernel killed and reaped everything in its pid namespace:
            # the groups are empty and removing them is the first try. Only if one is not (a process
            # that joined them from outside the namespace) is anything listed and killed.
            if cg is not None and not cg.try_remove():
                cg.kill_all()
                if not cg.try_remove():
                    return False
            m.registry.remove(sid)
            return True

        if not await m.blocking(finish):
            assert cg is not None
            await remove_cgroup(cg, m.blocking)
            await m.blocking(m.registry.remove, sid)
        if cg is not None:
            gone = True
        elif not gone and m.ids.ranged and self.host_uid is not None and m.ids.fixed is None and self.image is None:
            await m.blocking(kill_uid, self.host_uid)  # the uid is this sandbox's alone (an image sandbox's is not)
            gone = True
        if gone:
            m.ids.release(self.slot)
