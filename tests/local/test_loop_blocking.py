"""The local backend never blocks the event loop: registry files, cgroups, temp dirs and /proc go to threads.

Two facts, both independent of how busy the machine is, checked over a session's first sandbox
(the template's start and the plain path's probe included) and 24 more create/stop cycles:

- **No blocking call on the loop's thread.** An audit hook (``sys.addaudithook``) sees every
  file-system and process call CPython makes; on the loop's thread none may touch a real file
  system (``open`` of a regular file, ``os.listdir``/``scandir``/``mkdir``/``rmdir``/``remove``/
  ``rename``, ``shutil.rmtree``, ...) or sleep (``time.sleep``). Allowed, because none of them
  waits on a device: wrapping an fd already open (a pipe) in a file object; opening one file of
  the kernel's own pseudo file systems (``/proc``, a cgroup's ``/sys/fs/cgroup`` file, read
  through an fd kept open); and ``subprocess.Popen`` where asyncio's own subprocess transport
  calls it (the only way asyncio spawns a process). Import machinery (a module imported lazily
  on first use) is not the backend's doing and is skipped.
- **No callback does 20 ms of CPU work on the loop**, measured as the thread's own CPU time
  (``time.thread_time``), which a busy machine does not inflate. The test process's heap is frozen
  first (``gc.freeze``) so a full collection of a big pytest process does not count.

An earlier version judged by wall time and context switches, and failed under load: a callback that
waited for the GIL (held by a worker thread doing the backend's file work, as designed) counted as
a voluntary switch. These facts are what that version meant, measured directly.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import pytest

from .conftest import local_session, requires_isolation

pytestmark = requires_isolation

CPU_PER_CALLBACK = 0.02
CYCLES = 24
# the events that touch a file system or wait; their arguments' first item is the path
FILE_EVENTS = frozenset({
    "open", "os.listdir", "os.scandir", "os.mkdir", "os.rmdir", "os.remove", "os.rename", "os.chmod",
    "os.chown", "os.truncate", "os.utime", "os.link", "os.symlink", "shutil.rmtree", "shutil.copyfile",
    "shutil.move", "os.walk", "glob.glob", "os.chdir", "time.sleep", "subprocess.Popen", "os.system",
    "os.exec", "os.posix_spawn", "os.fork",
})  # fmt: skip
PSEUDO = ("/proc/", "/sys/fs/cgroup/")


def _allowed(event: str, args: tuple[Any, ...], stack: list[traceback.FrameSummary]) -> bool:
    if any("importlib" in f.filename for f in stack):
        return True  # a module imported on first use
    if event == "open" and (isinstance(args[0], int) or (isinstance(args[0], str) and args[0].startswith(PSEUDO))):
        return True  # an fd already open (a pipe), or one file of a pseudo file system
    return event == "subprocess.Popen" and any(f.filename.endswith("asyncio/unix_events.py") for f in stack)


class _Watch:
    """The audit hook and the callback timer; ``on`` only while the test's cycles run."""

    def __init__(self, run: Callable[[asyncio.Handle], None]) -> None:
        self.inner = run
        self.on = False
        self.inside = False
        self.thread = threading.get_ident()
        self.blocking: list[str] = []
        self.busy: list[str] = []

    def audit(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.on or self.inside or event not in FILE_EVENTS or threading.get_ident() != self.thread:
            return
        self.inside = True  # formatting the stack opens source files: no recursion
        try:
            stack = traceback.extract_stack()[:-1]
            if not _allowed(event, args, stack):
                where = " <- ".join(f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} {f.name}" for f in stack[::-1][:6])
                self.blocking.append(f"{event}{tuple(args)!r:.120} at {where}")
        finally:
            self.inside = False

    def __call__(self, handle: asyncio.Handle) -> None:
        cpu = time.thread_time()
        try:
            self.inner(handle)
        finally:
            cpu = time.thread_time() - cpu
            if self.on and cpu > CPU_PER_CALLBACK:
                self.busy.append(f"{handle!r:.160} used {cpu * 1e3:.0f} ms of CPU")


_WATCHES: list[_Watch] = []


def _hook(event: str, args: tuple[Any, ...]) -> None:
    for w in _WATCHES:
        w.audit(event, args)


sys.addaudithook(_hook)  # an audit hook cannot be removed; it does nothing while no test watches


@pytest.mark.parametrize("isolation", ["auto", "plain"])
async def test_create_and_stop_never_block_the_loop(tag: str, isolation: str, monkeypatch: pytest.MonkeyPatch) -> None:
    watch = _Watch(asyncio.Handle._run)
    monkeypatch.setattr(asyncio.Handle, "_run", lambda handle: watch(handle))  # a function: binds the handle
    _WATCHES.append(watch)
    gc.collect()
    gc.freeze()
    try:
        async with local_session(tag, isolation) as s:
            watch.on = True
            for _ in range(1 + CYCLES):
                sb = await s.sandbox()
                await sb.stop()
            watch.on = False
    finally:
        watch.on = False
        _WATCHES.remove(watch)
        gc.unfreeze()
    assert watch.blocking == [], f"{len(watch.blocking)} blocking calls on the loop: {watch.blocking[:4]}"
    assert watch.busy == [], f"{len(watch.busy)} callbacks did CPU work on the loop: {watch.busy[:2]}"
