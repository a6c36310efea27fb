"""Birth and death of template-born local sandboxes (the default path; see ``_template``).

A birth, in order (each step's failure leaves what ``stop`` can undo, recorded on the ``Box``):

1. ``Template.fork``: the template forks a newborn, which finds its birth configuration waiting
   (sent with the request) and enters its namespaces; meanwhile one worker-thread call writes the
   registry entry (no pid yet, the cgroups it is about to make), creates the sandbox's cgroups and
   opens the fds the newborn needs;
2. ``Template.deliver``: the newborn gets those fds and the agent's configuration, joins its
   cgroups, forks the sandbox's PID 1, which sends a pidfd of itself;
3. the channel is connected and the agent's hello awaited; meanwhile one worker-thread call writes
   the host pid (``Box.pid``) and its start time into the entry, and sets PID 1's OOM score from
   the host (``hold_oom_score``) before any command exists.

``stop``: SIGKILL through the pidfd (the sandbox's first process is PID 1 of its pid namespace, so
the kernel kills everything else in it), wait for the pidfd, remove the cgroups and the registry
entry in a worker thread. Nothing here opens a deadline of its own: the caller's scope bounds every
wait.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

import anyio

from ..._errors import SandboxCreationError
from ..._types import SandboxStatus
from ._box import Box, HostIds
from ._cgroup import CgroupManager
from ._evidence import Evidence
from ._leftover import kill_uid, remove_cgroup
from ._link import Link
from ._registry import Registry, proc_start_time
from ._template import Newborn, Template, pidfd_pid
from ._threads import Blocking
from .agent.protocol import MAX_BIRTH_CONFIG

__all__ = ["OOM_SCORE", "Births", "hold_oom_score"]

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


class Births:
    """Starts and stops the template-born sandboxes of one backend."""

    def __init__(
        self, cgroups: CgroupManager, registry: Registry, ids: HostIds, blocking: Blocking, eof_grace: float
    ) -> None:
        self.blocking = blocking
        self.eof_grace = eof_grace
        self.cgroups = cgroups
        self.registry = registry
        self.ids = ids

    def _prepare(self, box: Box, cgroup_limits: dict[str, Any]) -> dict[str, list[int]]:
        """Worker thread: the registry entry, then the cgroups and their fds (module docstring, step 1).

        The entry comes first and names the groups about to be made, so a driver that dies in between
        leaves nothing that ``list``/``sweep`` cannot find."""
        sid = box.spec.sandbox_id
        box.entry["cgroups"] = self.cgroups.planned(sid)
        self.registry.write(box.entry)
        if self.cgroups.available:
            box.cgroup = self.cgroups.create(sid, **cgroup_limits)
        return box.cgroup.open_fds() if box.cgroup else {}

    async def start(
        self,
        box: Box,
        template: Template,
        birth: dict[str, Any],
        agent: Callable[[], dict[str, Any]],
        cgroup_limits: dict[str, Any],
    ) -> None:
        """Birth ``box`` (see the module docstring); ``SandboxCreationError`` when it fails to start.

        ``agent()`` gives the agent's configuration once the cgroups exist."""
        sid = box.spec.sandbox_id
        box.stamps["start"] = time.monotonic()
        box.newborn = Newborn()
        first = json.dumps(birth, separators=(",", ":")).encode()
        if len(first) > MAX_BIRTH_CONFIG:
            raise SandboxCreationError(f"sandbox {sid}: its configuration is too large", sandbox_id=sid)
        await template.fork(box.newborn, first)  # the newborn enters its namespaces while we make its cgroups
        box.stamps["fork_sent"] = time.monotonic()
        try:
            named = await self.blocking(self._prepare, box, cgroup_limits)
            box.stamps["prepared"] = time.monotonic()
        except OSError as exc:
            raise SandboxCreationError(f"sandbox {sid}: cannot prepare its cgroups: {exc}", sandbox_id=sid) from exc
        fds: list[int] = []
        index: dict[str, list[int]] = {}
        for name in ("join", "cmd_procs", "cmd_events", "sandbox_cpu"):
            index[name] = list(range(len(fds), len(fds) + len(named.get(name, []))))
            fds += named.get(name, [])
        second = {
            "join": index["join"],
            "fds": {
                "cmd_procs": index["cmd_procs"],
                "cmd_events": index["cmd_events"][0] if index["cmd_events"] else None,
                "sandbox_cpu": index["sandbox_cpu"][0] if index["sandbox_cpu"] else None,
            },
            "agent": agent(),
        }
        body = json.dumps(second, separators=(",", ":")).encode()
        try:
            if len(body) > MAX_BIRTH_CONFIG:
                raise SandboxCreationError(f"sandbox {sid}: its configuration is too large", sandbox_id=sid)
            await template.deliver(box.newborn, body, fds)
            box.stamps["born"] = time.monotonic()
        finally:
            for fd in fds:
                os.close(fd)
        box.link = Link(sid, box.newborn, self.blocking, self.eof_grace)
        box.channel = box.link.channel
        box.channel.evidence = Evidence(box.cgroup.cpu_usage if box.cgroup else None)
        box.channel.default_budget = float(box.spec.defaults.resources.cpu_seconds or 0)
        await box.link.open()
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.blocking, self._record_pid, box)  # off the critical path
            await box.channel.ready.wait()
            box.stamps["hello"] = time.monotonic()
        if box.channel.hello is None:
            await box.link.exited.wait()  # the agent closed its channel: it is exiting
            tail = bytes(box.channel.stderr_tail).decode("utf-8", "replace").strip()
            raise SandboxCreationError(
                f"sandbox {sid} failed to start: {box.channel.closed_reason}: {tail[-2000:]}",
                sandbox_id=sid,
                reason="agent_start",
            )
        box.stamps["running"] = time.monotonic()
        box.status = SandboxStatus.RUNNING

    def _record_pid(self, box: Box) -> None:
        """Worker thread: the host pid of the sandbox's first process (from its pidfd) into the entry;
        its OOM score held (``hold_oom_score``)."""
        assert box.newborn is not None
        box.pid = box.newborn.pid = pidfd_pid(box.newborn.pidfd)
        if box.pid is not None:
            hold_oom_score(box.pid)
            box.entry.update(pid=box.pid, pid_start=proc_start_time(box.pid))
            self.registry.write(box.entry)

    async def stop(self, box: Box) -> None:
        """Stop ``box`` and release everything it holds (idempotent per box; bounded by the caller).

        The sandbox's first process is PID 1 of its pid namespace: SIGKILL through its pidfd makes the
        kernel kill everything else in the sandbox, at once and without the agent's help, so there is
        no graceful exit to wait for. Then its cgroups and registry entry go, in one worker-thread
        call when the groups are empty at the first try (a leftover process is killed and waited for).
        """
        link = box.link
        gone = False
        if link is not None:
            link.channel.terminating = True
            link.kill()
            await link.exited.wait()
            link.close()
            gone = True
        elif box.newborn is not None:
            box.newborn.close()  # a newborn without a channel yet reads EOF and exits
        sid = box.spec.sandbox_id
        cg = box.cgroup

        def finish() -> bool:
            if cg is not None:
                cg.kill_all()
                if not cg.try_remove():
                    return False
            self.registry.remove(sid)
            return True

        if not await self.blocking(finish):
            assert cg is not None
            await remove_cgroup(cg, self.blocking)
            await self.blocking(self.registry.remove, sid)
        if cg is not None:
            gone = True
        elif not gone and self.ids.ranged and box.host_uid is not None and self.ids.fixed is None:
            await self.blocking(kill_uid, box.host_uid)  # the uid is this sandbox's alone
            gone = True
        if gone:
            self.ids.release(box.slot)
