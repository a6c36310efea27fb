"""Small pieces the backends share: the destroyed-id memory, a sweep's victims, destroying many at once,
whether a driver's pid exists."""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager

import anyio

from .._errors import SandboxError
from .._log import log
from .._types import SandboxInfo

__all__ = ["MAX_REMEMBERED", "DestroyedIds", "destroy_each", "pid_exists", "sweep_victims"]

#: Destroyed ids a backend remembers (so ``status`` says COMPLETED and a create that lands late is undone).
MAX_REMEMBERED = 100_000


class DestroyedIds:
    """The ids of sandboxes a backend destroyed, the newest ``limit`` of them (oldest forgotten first).

    Every backend method is keyed by id, so a backend remembers what it destroyed: a late
    create is reaped, ``status`` answers COMPLETED, ``list`` hides what is going away."""

    __slots__ = ("_ids", "_limit")

    def __init__(self, limit: int = MAX_REMEMBERED) -> None:
        self._ids: OrderedDict[str, None] = OrderedDict()
        self._limit = limit

    def add(self, sandbox_id: str) -> None:
        self._ids[sandbox_id] = None
        self._ids.move_to_end(sandbox_id)
        while len(self._ids) > self._limit:
            self._ids.popitem(last=False)

    @contextmanager
    def destroying(self, sandbox_id: str) -> Iterator[None]:
        """Remember ``sandbox_id`` as destroyed from the start of the block (so a create still in flight
        undoes what it made), and forget it again if the block raises a ``SandboxError`` (the sandbox is
        still there: ``list`` and a sweep must see it)."""
        self.add(sandbox_id)
        try:
            yield
        except SandboxError:
            self.discard(sandbox_id)
            raise

    def discard(self, sandbox_id: str) -> None:
        """Forget ``sandbox_id`` (its destroy failed: the sandbox is still there, and ``list`` must show it)."""
        self._ids.pop(sandbox_id, None)

    def __contains__(self, sandbox_id: object) -> bool:
        return sandbox_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)


def sweep_victims(
    infos: Iterable[SandboxInfo], older_than_seconds: float | None, spare: Callable[[str], bool]
) -> list[str]:
    """The ids a sweep takes: those ``spare`` does not keep, older than ``older_than_seconds`` (None: any age)."""
    now = time.time()
    return [
        i.sandbox_id
        for i in infos
        if not spare(i.sandbox_id) and (older_than_seconds is None or now - i.created_at >= older_than_seconds)
    ]


def pid_exists(pid: int) -> bool:
    """Whether a process with this pid runs on this host (one we may not signal counts as running).

    Cannot tell a reused pid from the original; the local backend's registry compares start times too."""
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
