"""Destroying a pool's sandboxes: in the background when it runs, here otherwise; each counted once."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Coroutine, Iterable
from typing import TYPE_CHECKING, Any

import anyio

from .._errors import SandboxError
from .._types import SandboxStatus

if TYPE_CHECKING:
    from .._sandbox import Sandbox
    from ._background import Background
    from ._ledger import Ledger

__all__ = ["Disposal"]


class Disposal:
    """Stops sandboxes the pool no longer wants, keeping ``ledger.destroying`` (their slots) until they are gone.

    ``Sandbox.stop`` is shielded and bounded by its own stop deadline, and logs a failed
    destroy (the sandbox is then left for a sweep). A sandbox already stopped (by its
    user, say) only counts as destroyed. Once the background has stopped (closing,
    failed), sandboxes discarded without an await wait in ``orphans`` for the close.
    """

    def __init__(self, ledger: Ledger, background: Background) -> None:
        self._ledger = ledger
        self._background = background
        self._counted: weakref.WeakSet[Sandbox] = weakref.WeakSet()
        self._orphans: list[Sandbox] = []
        self.destroyed = 0

    def spawn(self, fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any, name: str) -> bool:
        """Background work for the pool's parts (False once the background has stopped)."""
        return self._background.spawn(fn, *args, name=name)

    def _count(self, sb: Sandbox) -> None:
        if sb not in self._counted:
            self._counted.add(sb)
            self.destroyed += 1

    def discard_soon(self, sb: Sandbox) -> None:
        """Destroy a sandbox that is in no set, in the background; never waits."""
        if sb.status is SandboxStatus.COMPLETED:
            self._count(sb)
            self._ledger.notify()
            return
        self._ledger.destroying += 1
        if not self._background.spawn(self._destroy, sb, name="pool destroy"):
            self._orphans.append(sb)  # slot held until close destroys it
        self._ledger.notify()

    async def discard(self, sb: Sandbox) -> None:
        """Destroy a sandbox that is in no set: in the background if it runs, else here (shielded, bounded)."""
        if self._background.running or sb.status is SandboxStatus.COMPLETED:
            self.discard_soon(sb)
            return
        self._ledger.destroying += 1
        self._ledger.notify()
        await self._destroy(sb)

    async def destroy_all(self, sandboxes: Iterable[Sandbox]) -> None:
        """Destroy sandboxes that are in no set, concurrently, here; returns when all are gone."""
        victims = list(sandboxes)
        self._ledger.destroying += len(victims)
        self._ledger.notify()
        async with anyio.create_task_group() as tg:
            for sb in victims:
                tg.start_soon(self._destroy, sb)

    def take_orphans(self) -> list[Sandbox]:
        """Sandboxes discarded after the background stopped (their slots are released by ``destroy_all``)."""
        orphans, self._orphans = self._orphans, []
        self._ledger.destroying -= len(orphans)
        return orphans

    async def _destroy(self, sb: Sandbox) -> None:
        try:
            await sb.stop()
        except SandboxError:
            pass  # logged by stop(); the sandbox is left for a sweep
        finally:
            self._ledger.destroying -= 1
            self._count(sb)
            self._ledger.notify()
