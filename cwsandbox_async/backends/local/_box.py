"""One local sandbox as the backend holds it, and the host uids sandboxes run as.

``HostIds`` decides the template's user namespace map and, per sandbox, which id of that namespace
(and so which host uid) it runs as: as root, a random unprivileged host uid per sandbox out of
``HOST_UID_RANGE``, all mapped into the template's namespace (16M ids, so two backends' sandboxes
collide with odds of one in 16M per pair, as before); otherwise the driver's own uid for all.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field
from typing import Any

import anyio

from ..._types import SandboxSpec, SandboxStatus
from ._bwrap import HOST_UID_RANGE
from ._cgroup import SandboxCgroup
from ._channel import AgentChannel
from ._link import Link
from ._plain import PlainSandbox
from ._template import Newborn

__all__ = ["Box", "HostIds"]


@dataclass
class Box:
    spec: SandboxSpec
    created_at: float = field(default_factory=time.time)
    channel: AgentChannel | None = None
    link: Link | None = None
    newborn: Newborn | None = None
    plain: PlainSandbox | None = None
    pid: int | None = None
    host_uid: int | None = None
    #: The sandbox's uid in the template's user namespace (released when its processes are gone).
    slot: int | None = None
    cgroup: SandboxCgroup | None = None
    workspace: str | None = None
    entry: dict[str, Any] = field(default_factory=dict)
    rlimits: dict[str, int] = field(default_factory=dict)
    #: Every exec's environment before its own ``env`` (the sandbox's defaults).
    env: dict[str, str] = field(default_factory=dict)
    #: Sandbox path prefix -> host path (``isolation="none"`` only: its workspace).
    path_map: list[tuple[str, str]] = field(default_factory=list)
    #: ``time.monotonic()`` at the end of each step of its birth, the driver's (``_born``)
    stamps: dict[str, float] = field(default_factory=dict)
    status: SandboxStatus = SandboxStatus.CREATING
    stopping: bool = False
    stopped: anyio.Event = field(default_factory=anyio.Event)

    def map_path(self, path: str) -> str:
        """``path`` as the agent sees it (through ``path_map``)."""
        for inside, outside in self.path_map:
            if path == inside or path.startswith(inside.rstrip("/") + "/"):
                return outside + path[len(inside.rstrip("/")) :]
        return path


class HostIds:
    """The template's id map and each sandbox's id in it (see the module docstring)."""

    def __init__(self, setting: int | str | None) -> None:
        base, last = HOST_UID_RANGE
        self.base, self.count = base, last - base + 1
        #: True when the template's namespace maps a range (as root): one host uid per sandbox.
        self.ranged = os.geteuid() == 0 and setting is not None
        self.fixed = setting if isinstance(setting, int) else None
        self._live: set[int] = set()

    def id_map(self) -> dict[str, list[str]]:
        if not self.ranged:
            return {"uid": [f"0 {os.geteuid()} 1"], "gid": [f"0 {os.getegid()} 1"]}
        lines = [f"0 {self.base} {self.count}"]
        if self.fixed is not None and not self.base <= self.fixed < self.base + self.count:
            lines.append(f"{self.count} {self.fixed} 1")
        return {"uid": lines, "gid": lines}

    def take(self) -> tuple[int, int]:
        """(id in the template's namespace, host uid) for a new sandbox."""
        if not self.ranged:
            return 0, os.geteuid()
        if self.fixed is not None:
            slot = self.fixed - self.base if self.base <= self.fixed < self.base + self.count else self.count
            return slot, self.fixed
        while True:
            slot = random.randrange(1, self.count)
            if slot not in self._live:
                self._live.add(slot)
                return slot, self.base + slot

    def release(self, slot: int | None) -> None:
        if slot is not None:
            self._live.discard(slot)
