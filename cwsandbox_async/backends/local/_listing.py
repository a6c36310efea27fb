"""``status`` and ``list`` of a ``LocalBackend``: what it holds, and what the registry says of the rest.

``Listing`` is a mixin of ``LocalBackend`` (``_backend``). Registry reads and ``/proc`` checks run in a
worker thread; ``list`` with tags reaps the entries whose owner process is gone (``_leftover.reap``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ..._types import SandboxInfo, SandboxStatus
from ._box import Box
from ._leftover import entry_status, reap
from ._registry import Registry, pid_alive
from ._threads import Blocking

__all__ = ["ID_RE", "Listing"]

ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class Listing:
    """The status and list half of ``LocalBackend`` (see the module docstring)."""

    name: str
    _blocking: Blocking
    _registry: Registry
    _boxes: dict[str, Box]
    _destroyed: dict[str, None]

    # -- status and list -----------------------------------------------------------
    async def status(self, sandbox_id: str) -> SandboxStatus:
        box = self._boxes.get(sandbox_id)
        if box is not None:
            if box.status is SandboxStatus.RUNNING and box.channel is not None and not box.channel.alive:
                box.status = SandboxStatus.FAILED
            return box.status
        if sandbox_id in self._destroyed:
            return SandboxStatus.COMPLETED
        if not ID_RE.match(sandbox_id):
            return SandboxStatus.FAILED
        entry = await self._blocking(self._registry.read, sandbox_id)
        if entry is None:
            return SandboxStatus.FAILED
        return entry_status(entry, pid_alive(entry.get("owner_pid"), entry.get("owner_start")))

    async def list(self, tags: Sequence[str] = ()) -> list[SandboxInfo]:
        """Sandboxes carrying all of ``tags``, from the registry (this process's and others').

        With ``tags`` given, entries whose owner process is gone are reaped on the way (``_leftover.reap``:
        their leftovers destroyed, their entries removed) and listed once more with ``reaped=True``.
        Entries of a live owner are never touched; without tags nothing is reaped (only ``sweep``).
        """
        wanted = set(tags)

        def read() -> list[tuple[dict[str, Any], bool]]:
            out = []
            for e in self._registry.read_all():
                if wanted.issubset(str(t) for t in e.get("tags") or ()):
                    out.append((e, pid_alive(e.get("owner_pid"), e.get("owner_start"))))
            return out

        found = await self._blocking(read)
        reaped = await reap(found if wanted else [], self._registry, self._blocking)
        out = []
        for e, owner_alive in found:
            sid = str(e["sandbox_id"])
            box = self._boxes.get(sid)
            out.append(
                SandboxInfo(
                    sandbox_id=sid,
                    tags=tuple(str(t) for t in e.get("tags") or ()),
                    status=box.status if box is not None else entry_status(e, owner_alive),
                    created_at=float(e.get("created_at") or 0.0),
                    session_id=e.get("session_id"),
                    owner_pid=e.get("owner_pid"),
                    owner_alive=owner_alive,
                    backend=self.name,
                    reaped=sid in reaped,
                )
            )
        out.sort(key=lambda i: i.created_at)
        return out
