"""Stopping sandboxes from their registry entries: processes, cgroups and directories, checked first.

Used for sandboxes this process does not hold (left by a crashed driver, or owned
by another live one) and for the final cleanup of its own. Nothing is killed or
removed unless it is provably ours: a pid must still be the process that started
at the recorded time and run the recorded executable with the sandbox id on its
command line; a cgroup must sit under a cgroup mount and carry our prefix; a
directory must be one we create (``cwsandbox-``/``ws-`` prefixes, in /tmp or the
state directory).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
from typing import Any

import anyio

from ..._log import log
from ..._types import SandboxStatus
from ._cgroup import SandboxCgroup, is_our_cgroup
from ._registry import Registry, pid_alive

__all__ = ["destroy_leftover", "entry_status", "kill_group", "remove_cgroup", "remove_dir"]


def kill_group(pid: int) -> None:
    """SIGKILL a process group (and the process, in case it left its group)."""
    for target in (-pid, pid):
        with contextlib.suppress(OSError):
            os.kill(target, signal.SIGKILL)


def kill_uid(uid: int) -> int:
    """SIGKILL every process running as host ``uid`` (a sandbox's own, unshared uid); return how many.

    The last resort for a sandbox whose start was interrupted before its processes could be
    tracked (no cgroup yet, bwrap's child in a session of its own): only ever called with a
    uid the backend picked for one sandbox, never with a shared one.
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


async def wait_gone(pid: int, start: object, within: float) -> bool:
    """Poll until a process we have no child watcher for is gone; False on timeout."""
    deadline = time.monotonic() + within
    while pid_alive(pid, start):
        if time.monotonic() > deadline:
            return False
        await anyio.sleep(0.01)
    return True


async def remove_cgroup(cg: SandboxCgroup) -> None:
    """Kill what is left in the groups and remove them (retrying while exiting processes leave)."""
    with anyio.move_on_after(5):
        while True:
            cg.kill_all()
            if cg.try_remove():
                return
            await anyio.sleep(0.02)
    log.warning("cgroup not removed", paths=cg.paths)


def remove_dir(path: object, state_dir: str) -> None:
    """Remove a sandbox directory, if it is one of ours."""
    if not isinstance(path, str):
        return
    real = os.path.realpath(path)
    parent, name = os.path.split(real)
    if parent in (os.path.realpath(state_dir), os.path.realpath(tempfile.gettempdir())) and (
        name.startswith(("cwsandbox-", "ws-"))
    ):
        shutil.rmtree(real, ignore_errors=True)


async def destroy_leftover(entry: dict[str, Any], registry: Registry) -> None:
    """Stop a sandbox another (possibly dead) process created, and clean up after it."""
    sid = str(entry["sandbox_id"])
    pid = entry.get("pid")
    if isinstance(pid, int) and pid_alive(pid, entry.get("pid_start")) and is_sandbox_process(pid, entry):
        kill_group(pid)
        await wait_gone(pid, entry.get("pid_start"), 5.0)
    paths = [p for p in entry.get("cgroups") or [] if isinstance(p, str) and is_our_cgroup(p)]
    if paths:
        await remove_cgroup(SandboxCgroup(paths=paths))
    remove_dir(entry.get("workspace"), registry.state_dir)
    registry.remove(sid)
    log.info("leftover sandbox destroyed", sandbox_id=sid, owner_pid=entry.get("owner_pid"))
