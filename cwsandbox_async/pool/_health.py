"""Whether a sandbox may be handed out (status, lifetime at lease), and the periodic sweep of idle ones."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio

from .._errors import SandboxError, SandboxTimeoutError
from .._log import log

if TYPE_CHECKING:
    from .._sandbox import Sandbox

__all__ = ["Health"]


class Health:
    """Health checks for one pool's sandboxes.

    ``check_on_lease`` asks the backend for a sandbox's status before it is handed out
    (a failed status call counts as dead). A lease with a hold timeout also asks the
    backend to end the sandbox's life ``hold + lifetime_margin`` seconds from now
    (``Sandbox.set_lifetime``), bounded by ``operation_timeout``; a sandbox whose lifetime
    cannot be set (a backend error, a missed deadline, or a backend that cannot extend a
    lifetime an earlier lease shortened) is not handed out. ``interval`` (None: off) is
    the period of the sweep over idle sandboxes.
    """

    def __init__(
        self,
        *,
        check_on_lease: bool,
        interval: float | None,
        lifetime_margin: float,
        operation_timeout: float,
    ) -> None:
        self._check_on_lease = check_on_lease
        self.interval = interval
        self._margin = lifetime_margin
        self._operation_timeout = operation_timeout

    async def alive(self, sb: Sandbox) -> bool:
        """Whether the backend still reports the sandbox alive (a failed status call counts as dead)."""
        if sb.status.is_terminal:
            return False
        try:
            return not (await sb.refresh_status()).is_terminal
        except SandboxError:
            return False

    async def fit_for_lease(self, sb: Sandbox, hold: float | None) -> bool:
        """Whether ``sb`` may be handed to a lease held at most ``hold`` seconds (None: unbounded)."""
        if self._check_on_lease:
            if not await self.alive(sb):
                return False
        elif sb.status.is_terminal:
            return False
        return hold is None or await self._set_lifetime(sb, hold + self._margin)

    async def _set_lifetime(self, sb: Sandbox, seconds: float) -> bool:
        try:
            await sb.set_lifetime(seconds, timeout_seconds=self._operation_timeout)
        except SandboxTimeoutError:
            log.info("setting a leased sandbox's lifetime timed out", sandbox_id=sb.sandbox_id)
            return False
        except SandboxError as exc:
            log.info("cannot set a leased sandbox's lifetime", sandbox_id=sb.sandbox_id, error=repr(exc))
            return False
        return True

    async def sweep(self, idle: Callable[[], list[Sandbox]], drop: Callable[[Sandbox], None]) -> None:
        """Forever: every ``interval``, probe each idle sandbox; ``drop`` the dead ones still idle."""
        assert self.interval is not None
        while True:
            await anyio.sleep(self.interval)
            for sb in idle():
                if not await self.alive(sb):
                    drop(sb)
