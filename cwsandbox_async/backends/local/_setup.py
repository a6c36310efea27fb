"""How a ``LocalBackend`` gets going: its template (started once, restarted if it died) or the plain probe.

``Setup`` is a mixin of ``LocalBackend`` (``_backend``). The template's configuration (its id map,
the root view's plan, the modules to preload) is built in a worker thread: making the plan stats
the host's directories. ``describe`` reports what was chosen, for ``doctor``.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

import anyio

from ..._errors import SandboxBackendUnavailableError
from ..._log import log
from ..._types import DEFAULT_WORKING_DIR
from ._box import HostIds
from ._bwrap import Layout, template_plan
from ._cgroup import CgroupManager
from ._probe import Probe, ProbeRequest, probe
from ._template import AGENT_DIR, Template
from ._threads import Blocking

__all__ = ["Setup"]


class Setup:
    """The template and probe half of ``LocalBackend`` (see the module docstring)."""

    _probe_cache: ClassVar[dict[ProbeRequest, Probe]] = {}
    _blocking: Blocking
    _cgroups: CgroupManager
    _ids: HostIds
    _probe: Probe | None
    _probe_lock: anyio.Lock | None
    _template: Template | None
    _python: str
    _python_prefix: str | None
    _preload: tuple[str, ...]
    _expose: tuple[str, ...]
    _hide: tuple[str, ...]
    _uid: int
    _gid: int
    _requested: str
    _agent_kind: str
    _host_uid_setting: int | str | None
    _bwrap: str | None

    def _template_config(self) -> dict[str, Any]:
        layout = Layout(
            hostname="cwsandbox-template",
            working_dir=DEFAULT_WORKING_DIR,
            tmp_bytes=None,
            workspace_bytes=None,
            network=False,
            uid=self._uid,
            gid=self._gid,
            extra_expose=self._expose,
            hide=self._hide,
            python_prefix=self._python_prefix,
        )
        return {
            "map_range": self._ids.ranged,
            "id_map": self._ids.id_map(),
            "plan": template_plan(layout, AGENT_DIR),
            "preload": list(self._preload),
        }

    async def _ensure_template(self) -> Template:
        """The live template, started (or restarted after it died) under the probe lock."""
        template = self._template
        if template is not None and template.alive:
            return template
        if self._probe_lock is None:
            self._probe_lock = anyio.Lock()
        async with self._probe_lock:
            if self._template is not None and not self._template.alive:
                log.warning("the sandbox template exited; starting a new one", pid=self._template.pid)
                await self._template.aclose()
                self._template = None
            if self._template is None:
                config = await self._blocking(self._template_config)  # stats the host's directories
                template = Template(self._python, config, self._blocking)
                await template.start()
                self._template = template
            return self._template

    async def _ensure_probe(self) -> Probe:
        if self._probe is not None:
            return self._probe
        if self._requested == "none":
            self._probe = Probe("none")
        elif self._agent_kind != "plain":
            try:
                await self._ensure_template()
                self._probe = Probe("unshare", drop_uid=self._ids.ranged)
            except SandboxBackendUnavailableError as exc:
                if self._requested != "auto" or self._agent_kind != "auto" or self._bwrap is None:
                    raise  # isolation="unshare" (or agent="python") was asked for by name: no fallback
                log.warning("the sandbox template cannot run here; using the plain exec path", error=str(exc))
        if self._probe is None:
            self._probe = await self._plain_probe()
        return self._probe

    async def _plain_probe(self) -> Probe:
        key = ProbeRequest(
            bwrap=self._bwrap,
            host_uid=self._host_uid_setting,
            python_prefix=self._python_prefix,
            uid=self._uid,
            gid=self._gid,
        )
        found = Setup._probe_cache.get(key)
        if found is None:
            found = Setup._probe_cache[key] = await probe(key)
        return found

    async def describe(self) -> dict[str, Any]:
        """What this machine gives the local backend, probed (for ``doctor``-style reports).

        Keys: ``isolation`` (unshare, bwrap, none), ``agent`` (python, plain),
        ``unprivileged_host_uid`` (sandboxes run as a non-root host uid), ``bwrap`` and
        ``bwrap_features``, ``cgroup`` (v1, v2 or None) and ``cgroup_controllers``,
        ``python`` (the agent's interpreter). Raises ``SandboxBackendUnavailableError``
        when no isolation works.
        """
        found = await self._ensure_probe()
        return {
            "isolation": found.level,
            "agent": "plain" if found.plain else "python",
            "template": found.level != "none" and not found.plain,
            "unprivileged_host_uid": found.drop_uid or os.geteuid() != 0,
            "bwrap": self._bwrap,
            "bwrap_features": sorted(found.features),
            "cgroup": self._cgroups.version,
            "cgroup_controllers": sorted(self._cgroups.available),
            "python": self._python,
        }
