"""Birth and death of template-born local sandboxes (the default path; see ``_template``).

A birth, in order (each step's failure leaves what ``stop`` can undo, recorded on the ``Box``):

1. one worker-thread call: create the sandbox's cgroups, write its registry entry (no pid yet),
   open the cgroup fds the newborn needs;
2. ``Template.birth``: the template forks, the newborn joins its cgroups and enters its namespaces
   and sends a pidfd of itself (``Box.pid`` is its host pid from then on);
3. the channel is connected and the agent's hello awaited;
4. one worker-thread call: the registry entry gets the pid and its start time.

``stop``: ask the agent to exit, SIGKILL through the pidfd after ``exit_grace_seconds``, wait for
the pidfd (the kernel has then killed everything in the sandbox's pid namespace), remove the
cgroups and the registry entry in a worker thread. Nothing here opens a deadline of its own apart
from that grace: the caller's scope bounds every wait.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import anyio

from ..._errors import SandboxCreationError
from ..._types import SandboxStatus
from ._box import Box, HostIds
from ._cgroup import CgroupManager
from ._leftover import kill_uid, remove_cgroup
from ._link import Link
from ._registry import Registry, proc_start_time
from ._template import Newborn, Template
from ._threads import Blocking

__all__ = ["Births"]


class Births:
    """Starts and stops the template-born sandboxes of one backend."""

    def __init__(
        self, cgroups: CgroupManager, registry: Registry, ids: HostIds, exit_grace_seconds: float, blocking: Blocking
    ) -> None:
        self.blocking = blocking
        self.cgroups = cgroups
        self.registry = registry
        self.ids = ids
        self.exit_grace_seconds = exit_grace_seconds

    def _prepare(self, box: Box, cgroup_limits: dict[str, Any]) -> tuple[list[int], list[int], int | None]:
        """Worker thread: cgroups, registry entry, cgroup fds (see the module docstring, step 1)."""
        sid = box.spec.sandbox_id
        if self.cgroups.available:
            box.cgroup = self.cgroups.create(sid, **cgroup_limits)
        box.entry["cgroups"] = list(box.cgroup.paths) if box.cgroup else []
        self.registry.write(box.entry)
        return box.cgroup.open_fds() if box.cgroup else ([], [], None)

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
        try:
            join, cmd, events = await self.blocking(self._prepare, box, cgroup_limits)
        except OSError as exc:
            raise SandboxCreationError(f"sandbox {sid}: cannot prepare its cgroups: {exc}", sandbox_id=sid) from exc
        fds = [*join, *cmd, *([events] if events is not None else [])]
        birth = {
            **birth,
            "join": list(range(len(join))),
            "fds": {
                "cmd_procs": list(range(len(join), len(join) + len(cmd))),
                "cmd_events": len(fds) - 1 if events is not None else None,
            },
        }
        body = json.dumps({"birth": birth, "agent": agent()}, separators=(",", ":")).encode()
        box.newborn = Newborn()
        try:
            await template.birth(len(body).to_bytes(4, "big") + body, fds, box.newborn)
        finally:
            for fd in fds:
                os.close(fd)
        box.pid = box.newborn.pid
        box.link = Link(sid, box.newborn)
        box.channel = box.link.channel
        await box.link.open()
        await box.channel.ready.wait()
        if box.channel.hello is None:
            await box.link.exited.wait()  # the agent closed its channel: it is exiting
            tail = bytes(box.channel.stderr_tail).decode("utf-8", "replace").strip()
            raise SandboxCreationError(
                f"sandbox {sid} failed to start: {box.channel.closed_reason}: {tail[-2000:]}",
                sandbox_id=sid,
                reason="agent_start",
            )
        await self.blocking(self._record_pid, box)
        box.status = SandboxStatus.RUNNING

    def _record_pid(self, box: Box) -> None:
        if box.pid is not None:
            box.entry.update(pid=box.pid, pid_start=proc_start_time(box.pid))
            self.registry.write(box.entry)

    async def stop(self, box: Box) -> None:
        """Stop ``box`` and release everything it holds (idempotent per box; bounded by the caller)."""
        link = box.link
        gone = False
        if link is not None:
            ch = link.channel
            ch.terminating = True
            ch.send_exit()
            with anyio.move_on_after(self.exit_grace_seconds):
                await link.exited.wait()
            link.kill()
            await link.exited.wait()
            link.close()
            gone = True
        elif box.newborn is not None:
            box.newborn.close()  # a newborn without a channel yet reads EOF and exits
        if box.cgroup is not None:
            await remove_cgroup(box.cgroup, self.blocking)
            gone = True
        elif not gone and self.ids.ranged and box.host_uid is not None and self.ids.fixed is None:
            await self.blocking(kill_uid, box.host_uid)  # the uid is this sandbox's alone
            gone = True
        await self.blocking(self.registry.remove, box.spec.sandbox_id)
        if gone:
            self.ids.release(box.slot)
