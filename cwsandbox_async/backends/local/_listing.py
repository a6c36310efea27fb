"""``status`` and ``list`` of a ``LocalBackend``: what it holds, and what the registry says of the rest.

``LocalBackend`` (``_backend``) holds one ``Listing``, which sees the backend's boxes. Registry reads
and ``/proc`` checks run in a worker thread. ``reap_for`` (at the first create with a set of tags)
reaps the entries carrying them whose owner process is gone (``_leftover.reap``); ``list`` only
reads, and reports what was reaped.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..._types import SandboxInfo, SandboxStatus
from ._box import Box
from ._leftover import entry_status, reap
from ._registry import Registry, pid_alive
from ._threads import Blocking

if TYPE_CHECKING:
    from .._shared import DestroyedIds

__all__ = ["ID_RE", "Listing"]

ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
#: Reaped sandboxes a backend keeps reporting in ``list`` (the oldest are forgotten first).
REMEMBER_REAPED = 4096


class Listing:
    """``status`` and ``list`` of one ``LocalBackend`` (see the module docstring)."""

    def __init__(
        self, name: str, registry: Registry, blocking: Blocking, boxes: dict[str, Box], destroyed: DestroyedIds
    ) -> None:
        self.name = name
        self._registry = registry
        self._blocking = blocking
        #: The backend's own (shared, not copied): what it holds, and what it destroyed.
        self._boxes = boxes
        self._destroyed = destroyed
        self._reaped: dict[str, SandboxInfo] = {}
        self._reaped_tags: set[tuple[str, ...]] = set()

    # -- status and list -----------------------------------------------------------
    async def status(self, sandbox_id: str) -> SandboxStatus:
        box = self._boxes.get(sandbox_id)
        if box is not None:
            if box.status is SandboxStatus.RUNNING and box.runner.failure() is not None:
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

    def _read(self, wanted: set[str]) -> list[tuple[dict[str, Any], bool]]:
        """Worker thread: registry entries carrying all of ``wanted``, each with whether its owner lives."""
        out = []
        for e in self._registry.read_all():
            if wanted.issubset(str(t) for t in e.get("tags") or ()):
                out.append((e, pid_alive(e.get("owner_pid"), e.get("owner_start"))))
        return out

    def _info(self, e: dict[str, Any], owner_alive: bool, reaped: bool = False) -> SandboxInfo:
        sid = str(e["sandbox_id"])
        box = self._boxes.get(sid)
        return SandboxInfo(
            sandbox_id=sid,
            tags=tuple(str(t) for t in e.get("tags") or ()),
            status=box.status
            if box is not None
            else entry_status(e, owner_alive)
            if not reaped
            else SandboxStatus.FAILED,
            created_at=float(e.get("created_at") or 0.0),
            session_id=e.get("session_id"),
            owner_pid=e.get("owner_pid"),
            owner_alive=owner_alive,
            backend=self.name,
            reaped=reaped,
        )

    async def reap_for(self, tags: Sequence[str]) -> None:
        """Reap, once per tag set, the registry entries carrying ``tags`` whose owner process is gone.

        Called at the first ``create`` of a sandbox with these tags (a new run of a driver cleans up
        after a crashed one of its kind); never touches an entry of a live owner (``_leftover.reap``).
        What it reaped, ``list`` reports with ``reaped=True`` from then on (the registry no longer has it).
        """
        key = tuple(sorted(set(tags)))
        if not key or key in self._reaped_tags:
            return
        self._reaped_tags.add(key)
        found = await self._blocking(self._read, set(key))
        done = await reap(found, self._registry, self._blocking)
        for e, owner_alive in found:
            if str(e["sandbox_id"]) in done:
                self._reaped[str(e["sandbox_id"])] = self._info(e, owner_alive, reaped=True)
        while len(self._reaped) > REMEMBER_REAPED:
            self._reaped.pop(next(iter(self._reaped)))

    async def list(self, tags: Sequence[str] = ()) -> list[SandboxInfo]:
        """Sandboxes carrying all of ``tags``, from the registry (this process's and others'), and those
        this backend reaped (``reaped=True``, see ``reap_for``). Reads only: nothing is destroyed here."""
        wanted = set(tags)
        out = [self._info(e, owner_alive) for e, owner_alive in await self._blocking(self._read, wanted)]
        listed = {i.sandbox_id for i in out}
        out += [i for sid, i in self._reaped.items() if sid not in listed and wanted.issubset(i.tags)]
        out.sort(key=lambda i: i.created_at)
        return out
