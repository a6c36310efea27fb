"""Stopping sandboxes from their registry entries: processes, cgroups and directories, checked first.

Used for sandboxes this process does not hold (left by a crashed driver, or owned by another live
one), for the final cleanup of its own, and for reaping (``reap``): entries whose owner process is
gone. Nothing is killed or removed unless it is provably ours: a pid must still be the process that
started at the recorded time and run the recorded executable (with the sandbox id on its command
line, or the template's marker for a template-born sandbox); a cgroup must sit under a cgroup mount
and carry our prefix; a directory must be one we create (``cwsandbox-``/``ws-`` prefixes, in /tmp
or the state directory). Every filesystem and ``/proc`` call runs in a worker thread.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from collections.abc import Sequence
from typing import Any

import anyio

from ..._log import log
from ..._types import SandboxStatus
from ._cgroup import SandboxCgroup, is_our_cgroup
from ._registry import Registry, pid_alive
from ._threads import Blocking

__all__ = [
    "destroy_leftover",
    "entry_status",
    "kill_group",
    "kill_uid",
    "reap",
    "remove_cgroup",
    "remove_dir",
    "wait_gone",
]


def kill_group(pid: int) -> None:
    """SIGKILL a process group (and the process, in case it left its group)."""
    for target in (-pid, pid):
        with contextlib.suppress(OSError):
            os.kill(target, signal.SIGKILL)


def kill_uid(uid: int) -> int:
    """SIGKILL every process running as host ``uid`` (a sandbox's own, unshared uid); return how many.

    The last resort for a sandbox whose start was interrupted before its processes could be
    tracked (no cgroup, no pidfd yet): only ever called with a uid the backend picked for one
    sandbox, never with a shared one.
    """
    if uid <= 0:
        return 0
    killed = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                uid_line = next((line for line in f if line.startswith(b"Uid:")), b"")
        except OSError:
            continue
        fields = uid_line.split()
        if len(fields) > 1 and int(fields[1]) == uid:
            with contextlib.suppress(OSError):
                os.kill(int(name), signal.SIGKILL)
                killed += 1
    return killed


def is_sandbox_process(pid: int, entry: dict[str, Any]) -> bool:
    """True if ``pid`` runs the sandbox the entry describes (checked before killing a leftover)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\x00")
    except OSError:
        return False
    marker = entry.get("marker")
    if isinstance(marker, str):  # a fork of the template: its command line is the template's
        return marker.encode() in argv
    exe = str(entry.get("exe") or "")
    sid = str(entry["sandbox_id"]).encode()
    return bool(argv) and os.path.basename(argv[0]).decode("utf-8", "replace") == exe and any(sid in a for a in argv)


def entry_status(entry: dict[str, Any], owner_alive: bool) -> SandboxStatus:
    """What a registry entry of a sandbox this process does not hold says about it."""
    if pid_alive(entry.get("pid"), entry.get("pid_start")):
        return SandboxStatus.RUNNING
    if entry.get("pid") is None and owner_alive:
        return SandboxStatus.RUNNING if entry.get("plain") else SandboxStatus.CREATING
    return SandboxStatus.FAILED


async def wait_gone(pid: int, start: object, blocking: Blocking) -> None:
    """Wait (bounded by the caller) until a process we have no child watcher or pidfd for is gone."""
    delay = 0.001
    while await blocking(pid_alive, pid, start):
        await anyio.sleep(delay)
        delay = min(delay * 2, 0.05)


async def remove_cgroup(cg: SandboxCgroup, blocking: Blocking) -> None:
    """Kill what is left in the groups and remove them, retrying while exiting processes leave.

    Bounded by the caller: a group that cannot be emptied keeps this waiting until its deadline.
    """

    def attempt() -> bool:
        cg.kill_all()
        return cg.try_remove()

    delay = 0.001
    while not await blocking(attempt):
        await anyio.sleep(delay)
        delay = min(delay * 2, 0.05)


def remove_dir(path: object, state_dir: str) -> None:
    """Remove a sandbox directory, if it is one of ours (blocking: call it in a thread)."""
    if not isinstance(path, str):
        return
    real = os.path.realpath(path)
    parent, name = os.path.split(real)
    if parent in (os.path.realpath(state_dir), os.path.realpath(tempfile.gettempdir())) and (
        name.startswith(("cwsandbox-", "ws-"))
    ):
        shutil.rmtree(real, ignore_errors=True)


async def destroy_leftover(entry: dict[str, Any], registry: Registry, blocking: Blocking) -> None:
    """Stop a sandbox another (possibly dead) process created, and clean up after it."""
    sid = str(entry["sandbox_id"])
    pid = entry.get("pid")
    start = entry.get("pid_start")

    def kill() -> bool:
        if isinstance(pid, int) and pid_alive(pid, start) and is_sandbox_process(pid, entry):
            kill_group(pid)
            return True
        return False

    if await blocking(kill):
        assert isinstance(pid, int)
        await wait_gone(pid, start, blocking)

    def ours() -> list[str]:
        return [p for p in entry.get("cgroups") or [] if isinstance(p, str) and is_our_cgroup(p)]

    paths = await blocking(ours)
    if paths:
        await remove_cgroup(SandboxCgroup(paths=paths), blocking)

    def remove() -> None:
        remove_dir(entry.get("workspace"), registry.state_dir)
        registry.remove(sid)

    await blocking(remove)
    log.info("leftover sandbox destroyed", sandbox_id=sid, owner_pid=entry.get("owner_pid"))


async def reap(entries: Sequence[tuple[dict[str, Any], bool]], registry: Registry, blocking: Blocking) -> set[str]:
    """Destroy the sandboxes of ``(entry, owner alive)`` pairs whose owner is gone; their ids.

    Never touches an entry whose owner is alive (that process may still be using it). Entries are
    reaped one at a time; a failure to clean one up is logged and leaves its entry for ``sweep``.
    """
    reaped: set[str] = set()
    for entry, owner_alive in entries:
        if owner_alive:
            continue
        try:
            await destroy_leftover(entry, registry, blocking)
        except OSError as exc:  # the kernel refused a kill or a removal: sweep can try again
            log.warning("leftover not reaped", sandbox_id=entry.get("sandbox_id"), error=str(exc))
            continue
        reaped.add(str(entry["sandbox_id"]))
    return reaped
