"""The host uids local sandboxes run as.

``HostIds`` decides the template's user namespace map and, per sandbox, which id of that namespace
(and so which host uid) it runs as: as root, a random unprivileged host uid per sandbox out of
``HOST_UID_RANGE``, all mapped into the template's namespace (16M ids, so two backends' sandboxes
collide with odds of one in 16M per pair, as before); otherwise the driver's own uid for all.
"""

from __future__ import annotations

import os
import random

from ._bwrap import HOST_UID_RANGE

__all__ = ["HostIds"]


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
