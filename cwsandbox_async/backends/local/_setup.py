"""How a ``LocalBackend`` gets going: its template (started once, restarted if it died) or the plain probe.

``LocalBackend`` (``_backend``) holds one ``Setup``. The template's configuration (its id map,
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
from . import _native
from ._bwrap import Layout, template_plan
from ._probe import Probe, ProbeRequest, probe
from ._runners.base import Machine
from ._template import AGENT_DIR, Template
from .agent import _imageroot

#: Templates kept after their backend closed, for sandboxes other processes adopted (``Setup.aclose``).
KEPT_TEMPLATES: list[Template] = []

__all__ = ["Setup"]


class Setup:
    """The template and the probe of one ``LocalBackend`` (see the module docstring)."""

    _probe_cache: ClassVar[dict[ProbeRequest, Probe]] = {}

    def __init__(
        self, machine: Machine, requested: str, agent_kind: str, host_uid: int | str | None, bwrap: str | None
    ) -> None:
        self.machine = machine
        #: The isolation asked for (``auto``, ``unshare``, ``bwrap``, ``none``) and the agent kind.
        self.requested = requested
        self.agent_kind = agent_kind
        self.host_uid_setting = host_uid
        #: The bwrap binary (None: not installed).
        self.bwrap = bwrap
        #: What the probe chose (None until the first ``ensure_probe``).
        self.probe: Probe | None = None
        self.template: Template | None = None
        self._lock: anyio.Lock | None = None

    def _template_config(self) -> dict[str, Any]:
        m = self.machine
        layout = Layout(
            hostname="cwsandbox-template",
            working_dir=DEFAULT_WORKING_DIR,
            tmp_bytes=None,
            workspace_bytes=None,
            network=False,
            uid=m.uid,
            gid=m.gid,
            extra_expose=m.expose,
            hide=m.hide,
            python_prefix=m.python_prefix,
        )
        plan = template_plan(layout, AGENT_DIR)
        spawner = _native.spawner()  # built on first use (a compiler run, once per source version)
        if spawner is not None:
            plan.append(["ro", spawner, _native.INSIDE])
        layers = self._layers_dir()
        if layers is not None:  # image sandboxes' lowers, hidden from the others (``agent/_imageroot``)
            plan += [["layers", layers, _imageroot.LAYERS], ["dir", _imageroot.STAGE]]
        return {
            "layers": None if layers is None else {"path": layers, "owner": m.ids.image_owner},
            "map_range": m.ids.ranged,
            "id_map": m.ids.id_map(),
            "plan": plan,
            "preload": list(m.preload),
            "spawner": _native.INSIDE if spawner is not None else None,
        }

    def _layers_dir(self) -> str | None:
        """The image cache's unpacked layers directory (made if missing); None when it cannot be made
        (then every image sandbox fails to start, saying so, and host-root ones run as before)."""
        options = self.machine.image_options
        if options is None:
            return None
        path = os.path.realpath(os.path.join(options.cache_dir, "layers"))
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
        except OSError as exc:
            log.warning("the image cache cannot be made: image sandboxes will not start", path=path, error=str(exc))
            return None
        return path

    async def ensure_template(self) -> Template:
        """The live template, started (or restarted after it died) under the probe lock."""
        template = self.template
        if template is not None and template.alive:
            return template
        if self._lock is None:
            self._lock = anyio.Lock()
        async with self._lock:
            if self.template is not None and not self.template.alive:
                log.warning("the sandbox template exited; starting a new one", pid=self.template.pid)
                await self.template.aclose()
                self.template = None
            if self.template is None:
                config = await self.machine.blocking(self._template_config)  # stats the host's directories
                template = Template(self.machine.python, config, self.machine.blocking)
                await template.start()
                self.template = template
            return self.template

    async def ensure_probe(self) -> Probe:
        if self.probe is not None:
            return self.probe
        if self.requested == "none":
            self.probe = Probe("none")
        elif self.agent_kind != "plain":
            try:
                await self.ensure_template()
                self.probe = Probe("unshare", drop_uid=self.machine.ids.ranged)
            except SandboxBackendUnavailableError as exc:
                if self.requested != "auto" or self.agent_kind != "auto" or self.bwrap is None:
                    raise  # isolation="unshare" (or agent="python") was asked for by name: no fallback
                log.warning("the sandbox template cannot run here; using the plain exec path", error=str(exc))
        if self.probe is None:
            self.probe = await self._plain_probe()
        return self.probe

    async def _plain_probe(self) -> Probe:
        m = self.machine
        key = ProbeRequest(
            bwrap=self.bwrap,
            host_uid=self.host_uid_setting,
            python_prefix=m.python_prefix,
            uid=m.uid,
            gid=m.gid,
        )
        found = Setup._probe_cache.get(key)
        if found is None:
            found = Setup._probe_cache[key] = await probe(key)
        return found

    async def aclose(self, *, keep_template: bool = False) -> None:
        """Stop the template (and every sandbox born from it), if one runs; bounded by the caller.

        ``keep_template``: another process adopted a sandbox born from it (``_attach``), which lives only
        as long as the template does: the template is kept (``KEPT_TEMPLATES``) until this process exits,
        when the kernel ends it and that sandbox with it (the template dies with its parent)."""
        if self.template is not None:
            template, self.template = self.template, None
            if keep_template:
                KEPT_TEMPLATES.append(template)
                return
            await template.aclose()

    async def describe(self) -> dict[str, Any]:
        """What this machine gives the local backend, probed (for ``doctor``-style reports).

        Keys: ``isolation`` (unshare, bwrap, none), ``agent`` (python, plain),
        ``unprivileged_host_uid`` (sandboxes run as a non-root host uid), ``bwrap`` and
        ``bwrap_features``, ``cgroup`` (v1, v2 or None) and ``cgroup_controllers``,
        ``python`` (the agent's interpreter). Raises ``SandboxBackendUnavailableError``
        when no isolation works.
        """
        found = await self.ensure_probe()
        return {
            "isolation": found.level,
            "agent": "plain" if found.plain else "python",
            "template": found.level != "none" and not found.plain,
            "unprivileged_host_uid": found.drop_uid or os.geteuid() != 0,
            "bwrap": self.bwrap,
            "bwrap_features": sorted(found.features),
            "cgroup": self.machine.cgroups.version,
            "cgroup_controllers": sorted(self.machine.cgroups.available),
            "python": self.machine.python,
        }
