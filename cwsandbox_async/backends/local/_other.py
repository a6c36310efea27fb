"""The local backend's two paths without a template: plain (bwrap per exec) and unisolated (``none``).

``OtherPaths`` is a mixin of ``LocalBackend`` (``_backend``): the plain path (``isolation="bwrap"``,
``agent="plain"``, or the fallback where the template cannot run; see ``_plain``) keeps no process
between execs and runs each one as its own bwrap; the unisolated path (``isolation="none"``) starts
the agent as a host process of this user (booted from the agent bundle, see ``_protocol``), in a
temporary directory standing in for the working directory. Their teardown is ``_teardown_other``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import subprocess
import tempfile
from typing import Any

import anyio

from ..._errors import SandboxCreationError, SandboxTransportError
from ..._types import ExecExit, ExecRequest, SandboxStatus
from ..base import OutputCallback
from ._box import Box, HostIds
from ._bwrap import Layout, bwrap_argv, sandbox_env
from ._cgroup import CgroupManager
from ._channel import AgentChannel
from ._leftover import kill_group, remove_cgroup, remove_dir
from ._options import LocalOptions
from ._plain import PlainSandbox
from ._probe import Probe
from ._protocol import BOOTSTRAP, agent_bundle, boot_payload
from ._registry import Registry, proc_start_time
from ._threads import Blocking

__all__ = ["OtherPaths"]


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

    def _agent_config(self, box: Box, env: dict[str, str]) -> dict[str, Any]:
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

    async def _plain_write(self, box: Box, path: str, data: bytes) -> None:
        script = (
            '{ [ ! -e "$1" ] || [ -f "$1" ]; } || { echo "not a regular file" >&2; exit 1; }; '
            'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
        )
        argv = ("/bin/sh", "-c", script, "sh", path)
        req = ExecRequest(argv, "/", {}, data, self.options.plain_file_timeout, 1 << 16)
        PlainSandbox.check_file_result(await self._plain_exec(box, req, None), path)

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
