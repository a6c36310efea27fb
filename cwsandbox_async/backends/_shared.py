"""Small pieces the backends share: is a driver's pid alive, destroy many sandboxes at once."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Sequence

import anyio

from .._errors import SandboxError
from .._log import log

__all__ = ["destroy_each", "pid_alive"]


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid runs on this host (one we may not signal counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def destroy_each(ids: Sequence[str], destroy: Callable[[str], Awaitable[None]], what: str) -> list[str]:
    """Destroy every id concurrently; return those destroyed. A ``SandboxError`` for one is logged
    (``what`` names the backend) and leaves it out; anything else is a bug and propagates."""
    failed: set[str] = set()

    async def one(sandbox_id: str) -> None:
        try:
            await destroy(sandbox_id)
        except SandboxError as exc:
            failed.add(sandbox_id)
            log.warning(f"{what} sweep could not destroy a sandbox", sandbox_id=sandbox_id, error=repr(exc))

    async with anyio.create_task_group() as tg:
        for sandbox_id in ids:
            tg.start_soon(one, sandbox_id)
    return [i for i in ids if i not in failed]
