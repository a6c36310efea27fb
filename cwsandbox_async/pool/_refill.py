"""Keeping the pool filled: one loop that starts creations as the ledger changes, within the cap and the pace."""

from __future__ import annotations

import math
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

import anyio

from .._errors import SandboxError

if TYPE_CHECKING:
    from .._sandbox import Sandbox
    from ._create import Creator
    from ._ledger import Ledger
    from ._pacing import Pacer

__all__ = ["Refill"]


class Refill:
    """Starts creations for the idle target plus queued leases (``Ledger.creations_wanted``).

    At most ``pacer.limit`` creations run at once, none while the creator cools down
    after a creation ran out of attempts, none while ``can_create()`` is false. Each
    creation holds a ``warming`` slot from the moment it is started, through its retries,
    until its sandbox is placed (``deliver``) or it failed. A creation that fails with a
    ``SandboxError`` was counted and logged by the creator; any other exception is a bug
    and propagates (the pool's background fails with it).
    """

    def __init__(
        self,
        ledger: Ledger,
        creator: Creator,
        pacer: Pacer,
        *,
        spawn: Callable[..., bool],
        can_create: Callable[[], bool],
        deliver: Callable[[Sandbox], None],
    ) -> None:
        self._ledger = ledger
        self._creator = creator
        self._pacer = pacer
        self._spawn = spawn
        self._can_create = can_create
        self._deliver = deliver

    async def run(self) -> None:
        """Forever (in the pool's background): start what is wanted, then wait for the next change."""
        ledger = self._ledger
        while True:
            changed = ledger.changed()
            wake_at = math.inf
            n = self._startable() if self._can_create() else 0
            if n > 0:
                if anyio.current_time() < self._creator.cooling_until:
                    wake_at = self._creator.cooling_until
                else:
                    ledger.warming += n
                    limited = ledger.warming >= self._pacer.limit
                    for _ in range(n):
                        self._start(self._warm, limited)
                    ledger.notify()
                    continue
            with anyio.CancelScope(deadline=wake_at):
                await changed.wait()

    def _startable(self) -> int:
        return min(self._ledger.creations_wanted(), self._pacer.limit - self._ledger.warming)

    def _start(self, fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
        if not self._spawn(fn, *args, name="pool warm"):  # the background is stopping: give the slot back
            self._ledger.warming -= 1

    async def _warm(self, limited: bool) -> None:
        sb: Sandbox | None = None
        try:
            sb = await self._creator.create(limited=limited)
        except SandboxError:
            pass  # counted and logged by the creator; the loop honours its cool-down
        finally:
            self._ledger.warming -= 1
            if sb is not None:
                self._deliver(sb)
            self._ledger.notify()
