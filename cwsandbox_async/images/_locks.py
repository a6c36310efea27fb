"""Locks over the cache: ``flock`` across processes, an in-process lock map in front of it.

``flock`` locks belong to an open file description, so two opens in one process exclude each
other as two processes do; the in-process map only saves the second task from polling. A wait
polls ``LOCK_NB`` with a growing sleep (a thread blocked in ``flock`` could not be cancelled);
the pull's own deadline bounds it. A process that dies releases its locks with its descriptors.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import weakref
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio

__all__ = ["hold_shared", "locked", "try_locked"]

_POLL_FIRST = 0.005
_POLL_MAX = 0.2
_IN_PROCESS: weakref.WeakValueDictionary[str, anyio.Lock] = weakref.WeakValueDictionary()


def _open(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)


def _try(fd: int, shared: bool) -> bool:
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


async def _wait(fd: int, shared: bool) -> None:
    pause = _POLL_FIRST
    while not _try(fd, shared):
        await anyio.sleep(pause)
        pause = min(pause * 2, _POLL_MAX)


@contextlib.asynccontextmanager
async def locked(path: Path, *, shared: bool = False) -> AsyncIterator[None]:
    """Hold ``path``'s flock (exclusive by default) for the block; waits as long as it takes
    (bound it with the caller's deadline); released on any exit, cancellation included."""
    key = str(path)
    gate = None
    if not shared:
        gate = _IN_PROCESS.get(key)
        if gate is None:
            gate = _IN_PROCESS[key] = anyio.Lock()
    async with gate if gate is not None else contextlib.nullcontext():
        fd = _open(path)
        try:
            await _wait(fd, shared)
            yield
        finally:
            os.close(fd)


async def hold_shared(path: Path) -> int:
    """Take a shared flock on ``path`` and return its descriptor; closing it releases the lock."""
    fd = _open(path)
    try:
        await _wait(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def try_locked(path: Path) -> Iterator[bool]:
    """An exclusive flock if it is free right now: yields True holding it, False if someone holds it."""
    fd = _open(path)
    try:
        yield _try(fd, False)
    finally:
        os.close(fd)
