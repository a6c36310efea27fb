"""The local backend's two paths without a template: plain (bwrap per exec) and unisolated (``none``).

``OtherPaths`` is a mixin of ``LocalBackend`` (``_backend``): the plain path (``isolation="bwrap"``,
``agent="plain"``, or the fallback where the template cannot run; see ``_plain``) keeps no process
between execs and runs each one as its own bwrap; the unisolated path (``isolation="none"``) starts
the agent as a host process of this user (booted from the agent bundle, see ``_protocol``), with a
temporary directory standing in for the working directory; it serves the same orders as a born
sandbox's PID 1 (``_channel``), as a child subreaper instead of a namespace's init. Their
teardown is ``_teardown_other``.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import tempfile
from typing import Any

import anyio

from ..._errors import SandboxCreationError, SandboxTransportError
from ..._types import ExecExit, ExecRequest, SandboxStatus
from ..base import OutputCallback
from ._box import Box, HostIds
from ._bwrap import Layout, bwrap_argv, sandbox_env
from ._cgroup import CgroupManager
from ._leftover import kill_group, remove_cgroup, remove_dir
from ._link import Link
from ._options import LocalOptions
from ._plain import PlainSandbox
from ._probe import Probe
from ._protocol import BOOTSTRAP, agent_bundle, boot_payload
from ._registry import Registry, proc_start_time
from ._template import Newborn, pidfd_pid
from ._threads import Blocking

__all__ = ["CHANNEL_FD", "OtherPaths"]

#: The descriptor an unisolated agent finds its channel on.
CHANNEL_FD = 3


def boot_config(config: dict[str, Any], magic: str) -> bytes:
    """What the backend writes first to a new unisolated agent's stdin (see ``_protocol.BOOTSTRAP``)."""
    return boot_payload(agent_bundle(magic), config)


class OtherPaths:
    """The plain and unisolated paths of ``LocalBackend`` (see the module docstring)."""

    _blocking: Blocking
    _cgroups: CgroupManager
    _registry: Registry
    _ids: HostIds
    _probe: Probe | None
    _python: str
    _preload: tuple[str, ...]
    options: LocalOptions
    limits: dict[str, str]

    def _layout(self, box: Box) -> Layout:
        raise NotImplementedError

    def _entry(self, box: Box, found: Probe, exe: str) -> dict[str, Any]:
        raise NotImplementedError

    def _limits(self, box: Box) -> tuple[dict[str, int], dict[str, str]]:
        raise NotImplementedError

    def _cgroup_limits(self, box: Box) -> dict[str, Any]:
        raise NotImplementedError

    def _agent_config(self, box: Box) -> dict[str, Any]:
        raise NotImplementedError

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
        assert box.workspace is not None
        box.rlimits, enforced = self._limits(box)
        box.env = {**sandbox_env(d.working_dir), **d.env, "HOME": box.workspace}
        box.path_map = [(d.working_dir, box.workspace)]
        config = {
            **self._agent_config(box),
            "die_with_parent": True,
            "preload": list(self._preload),
            "channel_fd": CHANNEL_FD,
        }
        if box.cgroup is not None:  # the agent joins its group itself, each command the commands' group
            cg = box.cgroup
            config["cgroup_paths"] = {
                "agent_procs": [os.path.join(p, cg.join_file) for p in cg.agent_dirs],
                "cmd_procs": [os.path.join(p, cg.join_file) for p in cg.command_dirs],
                "cmd_events": cg.events,
            }
        newborn = self._spawn_agent(sid, config)
        box.pid = pidfd_pid(newborn.pidfd)
        box.link = Link(sid, newborn, self._blocking, self.options.eof_grace, reap=True)
        box.channel = box.link.channel
        await box.link.open()
        await box.channel.ready.wait()
        if box.channel.hello is None:
            await box.link.exited.wait()
            tail = bytes(box.channel.stderr_tail).decode("utf-8", "replace").strip()
            raise SandboxCreationError(
                f"sandbox {sid} failed to start: {box.channel.closed_reason}: {tail[-2000:]}",
                sandbox_id=sid,
                reason="agent_start",
            )
        if box.pid is not None:
            box.entry.update(pid=box.pid, pid_start=proc_start_time(box.pid))
        await self._blocking(self._registry.write, box.entry)
        self.limits = enforced
        box.status = SandboxStatus.RUNNING

    def _spawn_agent(self, sid: str, config: dict[str, Any]) -> Newborn:
        """Start an unisolated agent (``python3 -I -c BOOTSTRAP``): its package and configuration on
        stdin (a memfd), its channel on ``CHANNEL_FD``, stderr to a pipe. On the loop's own thread (the
        agent's parent-death signal follows the thread that started it); ``OSError`` if it cannot start."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        err_r, err_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        boot = os.memfd_create("cwsandbox-boot", os.MFD_CLOEXEC)
        newborn = Newborn(sock=mine, stderr=err_r)
        try:
            os.pwrite(boot, boot_config(config, importlib.util.MAGIC_NUMBER.hex()), 0)
            actions = [
                (os.POSIX_SPAWN_DUP2, boot, 0),
                (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                (os.POSIX_SPAWN_DUP2, err_w, 2),
                (os.POSIX_SPAWN_DUP2, theirs.fileno(), CHANNEL_FD),
            ]
            argv = [self._python, "-I", "-c", BOOTSTRAP, "cwsandbox-agent", sid]
            env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
            pid = os.posix_spawn(self._python, argv, env, file_actions=actions, setsid=True)
            newborn.pidfd = os.pidfd_open(pid)
        except BaseException:
            newborn.close()
            raise
        finally:
            theirs.close()
            os.close(err_w)
            os.close(boot)
        return newborn

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

    async def _plain_read(self, box: Box, path: str, max_bytes: int) -> bytes:
        req = ExecRequest(("cat", "--", path), "/", {}, None, self.options.plain_file_timeout, max_bytes + 1)
        result = await self._plain_exec(box, req, None)
        PlainSandbox.check_file_result(result, path, max_bytes)
        return result.stdout

    async def _teardown_other(self, box: Box) -> None:
        """The plain and unisolated paths."""
        link = box.link
        if link is not None:  # closing its channel makes the agent kill its commands and exit
            link.channel.terminating = True
            link.channel.close()
            with anyio.move_on_after(self.options.exit_grace):
                await link.exited.wait()
            if not link.exited.is_set():
                if box.pid is not None:
                    kill_group(box.pid)
                link.kill()
                await link.exited.wait()
            link.close()
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
