"""Attach: reaching a template-born sandbox another process of this user created (``LocalBackend.attach``).

Where the identity lives. A sandbox's registry entry (``_registry``) names its PID 1 (host pid and
start time) and, once PID 1 listens (``listen``), says ``"attach": true``: next to the entry, in the
same 0700 directory of this host user, ``<sandbox id>.sock`` is a listening ``SOCK_SEQPACKET``
socket whose descriptor PID 1 holds (``agent.protocol.O_LISTEN``). Only a process that can open
that directory reaches it: this host user, or root. No process of a sandbox can: the directory is
outside every sandbox's mount namespace, PID 1's descriptors are close-on-exec and it is not
dumpable (its ``/proc/1/fd`` cannot be opened), and PID 1 refuses a connection whose peer pid is
visible in its own pid namespace.

Attaching (``AttachedRunner.start``): read the entry; check PID 1 is the process it names (pid,
start time, the template's marker on its command line); take a pidfd of it and check again (so the
pidfd is that process, not a recycled pid); connect; wait for PID 1's hello on the new channel.
From then on the attached process has a channel of its own: execs, ``run_python`` and file calls
work as for the creator, with the same agent. PID 1 exits when its last channel closes, but a
sandbox never outlives its creator's process: every sandbox lives in the pid namespace of its
creator's template, which dies with that process (``agent/_rootfs``). An attached handle of a
sandbox whose creator died raises ``SandboxNotRunningError`` (infrastructure: neither the program
nor this caller ended it).

Ownership. The entry's ``owner_pid``/``owner_start`` say which process stops the sandbox at its
close. ``adopt=True`` rewrites them to this process: the creator's teardown then sees it no longer
owns the sandbox (``BornRunner.teardown``) and only closes its channel, and its backend's close keeps
the template running until that process exits (``Setup.aclose``). Without adopting, this
process never stops it except on an explicit ``destroy`` (``Sandbox.stop``); its close only closes
its channel. What an attached process does not have: the sandbox's cgroup fds (an exec's
``cpu_priority`` is then ignored) and CPU evidence for a timed-out exec's verdict (``_evidence``),
and its PID 1's stderr.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from typing import Any

from ..._errors import SandboxNotFoundError, SandboxNotSupportedError
from ..._types import SandboxSpec
from ._attach_socket import connect
from ._bwrap import sandbox_env
from ._leftover import destroy_leftover, is_sandbox_process
from ._link import Link, ProcessHandles
from ._probe import Probe
from ._registry import Registry, pid_alive, proc_start_time
from ._runners.base import AgentRunner, Machine

__all__ = ["AttachedRunner"]


def _open(registry: Registry, sandbox_id: str) -> tuple[dict[str, Any], int, socket.socket]:
    """Worker thread: the entry, a pidfd of its PID 1 and a connected channel (see the module docstring).

    ``SandboxNotFoundError`` for no entry, a PID 1 that is gone or not the entry's, or no listener;
    ``SandboxNotSupportedError`` for a sandbox that cannot be attached (no agent, or not born)."""
    entry = registry.read(sandbox_id)
    if entry is None:
        raise SandboxNotFoundError(
            f"no sandbox {sandbox_id} of this user (see Session.list)", sandbox_id=sandbox_id, infrastructure=False
        )
    pid, start = entry.get("pid"), entry.get("pid_start")
    if not entry.get("attach"):
        if entry.get("plain") or entry.get("marker") is None:
            raise SandboxNotSupportedError(
                f"sandbox {sandbox_id} has no agent to attach to (isolation {entry.get('isolation')!r})",
                sandbox_id=sandbox_id,
            )
        raise SandboxNotFoundError(f"sandbox {sandbox_id} is not ready", sandbox_id=sandbox_id, infrastructure=False)
    gone = SandboxNotFoundError(f"sandbox {sandbox_id} is gone", sandbox_id=sandbox_id, infrastructure=False)
    if not isinstance(pid, int) or not pid_alive(pid, start) or not is_sandbox_process(pid, entry):
        raise gone
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        raise gone from None
    try:
        if proc_start_time(pid) != start:  # the pid was recycled between the check and the pidfd
            raise gone
        try:
            sock = connect(registry, sandbox_id)
        except OSError as exc:
            raise SandboxNotFoundError(
                f"sandbox {sandbox_id} does not answer: {exc}", sandbox_id=sandbox_id, infrastructure=False
            ) from exc
    except BaseException:
        os.close(pidfd)
        raise
    return entry, pidfd, sock


class AttachedRunner(AgentRunner):
    """A sandbox this process attached to (see the module docstring); a ``Runner``. ``adopt``: this
    process becomes its owner."""

    def __init__(self, spec: SandboxSpec, machine: Machine, adopt: bool) -> None:
        super().__init__(spec, machine, Probe(level="unshare"))  # only a born sandbox listens
        self.adopt = adopt
        self.entry: dict[str, Any] = {}
        #: Set by ``destroy``: this process's teardown stops the sandbox (adopted, or asked to).
        self.stop_on_teardown = adopt

    async def start(self) -> dict[str, str]:
        """Attach; ``SandboxNotFoundError``/``SandboxNotSupportedError`` as ``_open`` says; bounded by the caller."""
        m, sid = self.machine, self.spec.sandbox_id
        entry, pidfd, sock = await m.blocking(_open, m.registry, sid)
        self.entry = entry
        self.pid = int(entry["pid"])
        self.host_uid = entry.get("host_uid")
        handles = ProcessHandles(sock=sock, pidfd=pidfd, pid=self.pid)
        self.link = link = Link(sid, handles, m.blocking, m.options.eof_grace, m.options.exit_status_wait)
        defaults = entry.get("defaults") or {}
        link.channel.default_budget = float(defaults.get("cpu_seconds") or 0)
        await link.open()
        await link.channel.ready.wait()
        if link.channel.hello is None:
            raise SandboxNotFoundError(
                f"sandbox {sid} closed the channel: {link.channel.closed_reason}", sandbox_id=sid, infrastructure=False
            )
        if defaults.get("image"):  # the image's environment and working directory, whole (``_image_run``)
            self.env = dict(defaults.get("env") or {})
            self.default_cwd = defaults.get("cwd")
        else:
            self.env = {**sandbox_env(str(defaults.get("working_dir") or "/workspace")), **(defaults.get("env") or {})}
        self.spec = dataclasses.replace(
            self.spec,
            defaults=dataclasses.replace(
                self.spec.defaults,
                tags=tuple(str(t) for t in entry.get("tags") or ()),
                working_dir=str(defaults.get("working_dir") or self.spec.defaults.working_dir),
                env=dict(defaults.get("env") or {}),
            ),
        )
        if self.adopt:
            entry.update(
                owner_pid=os.getpid(),
                owner_start=m.owner_start,
                owner_token=m.owner_token,
                session_id=self.spec.session_id,
            )
            await m.blocking(m.registry.write, entry)
        return {}

    async def teardown(self) -> None:
        """Close this process's channel; stop the sandbox first if it adopted it or was asked to
        (``stop_on_teardown``): SIGKILL through the pidfd, then its cgroups and registry entry
        (``_leftover.destroy_leftover``). Bounded by the caller."""
        link = self.link
        if link is None:
            return
        if self.stop_on_teardown:
            link.channel.terminating = True
            link.kill()
            await link.exited.wait()
        link.close()
        if self.stop_on_teardown:
            await destroy_leftover(self.entry, self.machine.registry, self.machine.blocking)
