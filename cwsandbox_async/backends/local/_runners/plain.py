"""``PlainRunner``: a sandbox with no process between execs, each exec its own bwrap (see ``_plain``).

The plain path: ``isolation="bwrap"``, ``agent="plain"``, or the fallback where the template cannot
run. Files go through ``cat`` and ``sh`` in a bwrap of their own; ``run_python`` is ``python3 -c``.
"""

from __future__ import annotations

import dataclasses
import os

from ...._errors import SandboxNotRunningError, SandboxTransportError
from ...._types import ExecExit, ExecRequest, SandboxSpec
from ...base import OutputCallback
from .._bwrap import bwrap_argv
from .._leftover import remove_cgroup
from .._plain import PlainSandbox
from .._probe import Probe
from .base import SAFE_PATH_ENV, BaseRunner, Machine

__all__ = ["PlainRunner"]

#: ``write_file``'s command: refuse what is not a regular file, make the parents, write stdin.
WRITE_SCRIPT = (
    '{ [ ! -e "$1" ] || [ -f "$1" ]; } || { echo "not a regular file" >&2; exit 1; }; '
    'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
)


class PlainRunner(BaseRunner):
    """One plain sandbox (see the module docstring); a ``Runner``."""

    def __init__(self, spec: SandboxSpec, machine: Machine, found: Probe) -> None:
        super().__init__(spec, machine, found)  # no process at rest: ``pid`` stays None
        self.sandbox: PlainSandbox | None = None
        self.rlimits: dict[str, int] = {}

    async def start(self) -> dict[str, str]:
        m, spec, found = self.machine, self.spec, self.found

        def prepare() -> None:
            if m.cgroups.available:
                self.cgroup = m.cgroups.create(spec.sandbox_id, **m.cgroup_limits(spec))
            self.sandbox = sandbox = PlainSandbox(spec.sandbox_id, self.host_uid)
            exe = os.path.basename(found.bwrap or "bwrap")
            m.registry.write(m.entry(spec, found, exe, self.created_at, self.host_uid, self.cgroup, sandbox.base))

        self.host_uid = m.ids.take()[1] if found.drop_uid else None
        await m.blocking(prepare)
        self.rlimits, enforced = m.rlimits(spec, self.cgroup, self.host_uid, tmpfs=False)
        return enforced

    def failure(self) -> SandboxNotRunningError | None:
        return None  # nothing runs between execs, so nothing can die under us

    async def exec(self, request: ExecRequest, on_output: OutputCallback | None) -> ExecExit:
        found, sandbox = self.found, self.sandbox
        assert sandbox is not None and found.bwrap is not None
        bwrap = found.bwrap
        env = {**self.spec.defaults.env, **request.env}
        command = PlainSandbox.wrap(request.argv, self.rlimits)
        layout = self.machine.layout(self.spec, tmp_host=sandbox.tmp, workspace_host=sandbox.workspace)

        def build(block_fd: int) -> list[str]:
            return bwrap_argv(bwrap, found.features, layout, command, block_fd, request.cwd, env)

        try:
            return await sandbox.run(build, request, self.cgroup, self.host_uid, on_output)
        except OSError as exc:
            sid = self.spec.sandbox_id
            raise SandboxTransportError(f"cannot run bwrap for sandbox {sid}: {exc}", sandbox_id=sid) from exc

    async def run_python(self, source: str, request: ExecRequest, on_output: OutputCallback | None) -> ExecExit:
        env = {**SAFE_PATH_ENV, **request.env}
        argv = ("python3", "-I", "-c", source)  # isolated, as the warm interpreter and Backend.run_python
        return await self.exec(dataclasses.replace(request, argv=argv, env=env), on_output)

    async def read(self, path: str, max_bytes: int) -> bytes:
        timeout = self.machine.options.plain_file_timeout
        result = await self.exec(ExecRequest(("cat", "--", path), "/", {}, None, timeout, max_bytes + 1), None)
        PlainSandbox.check_file_result(result, path, max_bytes)
        return result.stdout

    async def write(self, path: str, data: bytes) -> None:
        timeout = self.machine.options.plain_file_timeout
        argv = ("/bin/sh", "-c", WRITE_SCRIPT, "sh", path)
        result = await self.exec(ExecRequest(argv, "/", {}, data, timeout, 1 << 16), None)
        PlainSandbox.check_file_result(result, path)

    async def teardown(self) -> None:
        m = self.machine
        if self.sandbox is not None:
            self.sandbox.kill_all()
        if self.cgroup is not None:
            await remove_cgroup(self.cgroup, m.blocking)

        def remove() -> None:
            if self.sandbox is not None:
                self.sandbox.remove()
            m.registry.remove(self.spec.sandbox_id)

        await m.blocking(remove)
