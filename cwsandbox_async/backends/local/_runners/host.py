"""``HostAgentRunner``: a sandbox without isolation (``isolation="none"``), its agent a host process.

The agent runs as a process of this user on the host (booted from the agent bundle, see
``host_boot``), with a temporary directory standing in for the working directory (paths under it
are mapped, see ``AgentRunner.path_map``); it serves the same orders as a born sandbox's PID 1
(``_channel``), as a child subreaper instead of a namespace's init. Nothing isolates it: its
commands can signal it, so a signal is no evidence of whose failure its death was (``_link``).
"""

from __future__ import annotations

import importlib.util
import os
import socket
import tempfile
from typing import Any

import anyio

from ...._types import SandboxSpec
from .._bwrap import sandbox_env
from .._leftover import kill_group, remove_cgroup, remove_dir
from .._link import Link, ProcessHandles
from .._probe import Probe
from .._registry import proc_start_time
from .._template import pidfd_pid
from .base import AgentRunner, Machine, agent_start_error
from .host_boot import BOOTSTRAP, agent_bundle, boot_payload

__all__ = ["CHANNEL_FD", "HostAgentRunner", "boot_config"]

#: The descriptor a host agent finds its channel on.
CHANNEL_FD = 3


def boot_config(config: dict[str, Any], magic: str) -> bytes:
    """What the backend writes first to a new host agent's stdin (see ``host_boot.BOOTSTRAP``)."""
    return boot_payload(agent_bundle(magic), config)


class HostAgentRunner(AgentRunner):
    """One unisolated sandbox (see the module docstring); a ``Runner``."""

    def __init__(self, spec: SandboxSpec, machine: Machine, found: Probe) -> None:
        super().__init__(spec, machine, found)
        self.workspace: str | None = None
        self.env: dict[str, str] = {}

    async def start(self) -> dict[str, str]:
        m, spec, d = self.machine, self.spec, self.spec.defaults
        sid = spec.sandbox_id
        entry: dict[str, Any] = {}

        def prepare() -> str:
            if m.cgroups.available:
                self.cgroup = m.cgroups.create(sid, **m.cgroup_limits(spec))
            m.registry.ensure()  # the workspace lives in the state directory
            self.workspace = workspace = tempfile.mkdtemp(prefix=f"ws-{sid}-", dir=m.registry.state_dir)
            exe = os.path.basename(m.python)
            entry.update(m.entry(spec, self.found, exe, self.created_at, None, self.cgroup, workspace))
            m.registry.write(entry)
            return workspace

        workspace = await m.blocking(prepare)
        rlimits, enforced = m.rlimits(spec, self.cgroup, None, tmpfs=True)
        config = {
            **m.agent_config(spec, rlimits),
            "die_with_parent": True,
            "preload": list(m.preload),
            "channel_fd": CHANNEL_FD,
        }
        if self.cgroup is not None:  # the agent joins its group itself, each command the commands' group
            cg = self.cgroup
            config["cgroup_paths"] = {
                "agent_procs": [os.path.join(p, cg.join_file) for p in cg.agent_dirs],
                "cmd_procs": [os.path.join(p, cg.join_file) for p in cg.command_dirs],
                "cmd_events": cg.events,
            }
        handles = self._spawn(config)
        self.pid = pidfd_pid(handles.pidfd)
        self.link = link = Link(sid, handles, m.blocking, m.options.eof_grace, m.options.exit_status_wait, reap=True)
        channel = link.channel
        await link.open()
        await channel.ready.wait()
        if channel.hello is None:
            raise await agent_start_error(link, sid)
        if self.pid is not None:
            entry.update(pid=self.pid, pid_start=proc_start_time(self.pid))
        await m.blocking(m.registry.write, entry)
        env = {**sandbox_env(d.working_dir), **d.env, "HOME": workspace}
        self.env = env
        self.path_map = ((d.working_dir, workspace),)
        return enforced

    def _spawn(self, config: dict[str, Any]) -> ProcessHandles:
        """Start the agent (``python3 -I -c BOOTSTRAP``): its package and configuration on stdin (a
        memfd), its channel on ``CHANNEL_FD``, stderr to a pipe. On the loop's own thread (the agent's
        parent-death signal follows the thread that started it); ``OSError`` if it cannot start."""
        python = self.machine.python
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        err_r, err_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        boot = os.memfd_create("cwsandbox-boot", os.MFD_CLOEXEC)
        handles = ProcessHandles(sock=mine, stderr=err_r)
        try:
            os.pwrite(boot, boot_config(config, importlib.util.MAGIC_NUMBER.hex()), 0)
            actions = [
                (os.POSIX_SPAWN_DUP2, boot, 0),
                (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                (os.POSIX_SPAWN_DUP2, err_w, 2),
                (os.POSIX_SPAWN_DUP2, theirs.fileno(), CHANNEL_FD),
            ]
            argv = [python, "-I", "-c", BOOTSTRAP, "cwsandbox-agent", self.spec.sandbox_id]
            env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
            pid = os.posix_spawn(python, argv, env, file_actions=actions, setsid=True)
            handles.pidfd = os.pidfd_open(pid)
        except BaseException:
            handles.close()
            raise
        finally:
            theirs.close()
            os.close(err_w)
            os.close(boot)
        return handles

    # -- teardown ----------------------------------------------------------------
    async def teardown(self) -> None:
        """Closing its channel makes the agent kill its commands and exit; past ``exit_grace``, its
        process group is killed. Then its cgroups, workspace and registry entry go."""
        m = self.machine
        link = self.link
        if link is not None:
            link.channel.terminating = True
            link.channel.close()
            with anyio.move_on_after(m.options.exit_grace):
                await link.exited.wait()
            if not link.exited.is_set():
                if self.pid is not None:
                    kill_group(self.pid)
                link.kill()
                await link.exited.wait()
            link.close()
        if self.cgroup is not None:
            await remove_cgroup(self.cgroup, m.blocking)

        def remove() -> None:
            remove_dir(self.workspace, m.registry.state_dir)
            m.registry.remove(self.spec.sandbox_id)

        await m.blocking(remove)
