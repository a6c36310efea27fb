"""The host uids local sandboxes run as.

``HostIds`` decides the template's user namespace map and, per sandbox, which id of that namespace
(and so which host uid) it runs as: as root, a random unprivileged host uid per sandbox out of
``HOST_UID_RANGE``, all mapped into the template's namespace (16M ids, so two backends' sandboxes
collide with odds of one in 16M per pair, as before); otherwise the driver's own uid for all.

Image sandboxes of a root driver all run as one host uid, ``image_owner`` (the last id of the range,
never drawn for another sandbox): their image files, unpacked as the driver's (single-uid layers),
are shown as that uid's through one idmapped mount the template makes once (``agent/_rootfs``), so
that every sandbox of every image shares the read-only lowers. They are then apart from one another
as a non-root driver's sandboxes are (their own namespaces, cgroups and per-sandbox kernel budgets),
not by uid.
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

    @property
    def image_slot(self) -> int | None:
        """The id image sandboxes run as in the template's namespace (None: not ranged, see ``take``)."""
        return self.count - 1 if self.ranged and self.fixed is None else None

    @property
    def image_owner(self) -> int | None:
        """The host uid image sandboxes run as, which their layers' files are idmapped to (None: the
        driver's own uid, whose files the layers are already)."""
        if not self.ranged:
            return None
        return self.fixed if self.fixed is not None else self.base + self.count - 1

    def take(self, image: bool = False) -> tuple[int, int]:
        """(id in the template's namespace, host uid) for a new sandbox (``image``: an image sandbox)."""
        if image and self.image_slot is not None:
            return self.image_slot, self.base + self.image_slot
        if not self.ranged:
            return 0, os.geteuid()
        if self.fixed is not None:
            slot = self.fixed - self.base if self.base <= self.fixed < self.base + self.count else self.count
            return slot, self.fixed
        while True:
            slot = random.randrange(1, self.count - 1)  # the last is image sandboxes' (``image_slot``)
            if slot not in self._live:
                self._live.add(slot)
                return slot, self.base + slot

    def release(self, slot: int | None) -> None:
        if slot is not None:
            self._live.discard(slot)
