"""The registry: entries whose owner process is gone are reaped by ``list`` (its tags only, never a live owner's)."""

from __future__ import annotations

import os
import subprocess
import time

import cwsandbox_async as cwa
from cwsandbox_async.backends.local import LocalBackend
from cwsandbox_async.backends.local._registry import Registry, proc_start_time


def entry(sandbox_id: str, tags: list[str], owner_pid: int, owner_start: int | None) -> dict[str, object]:
    return {
        "sandbox_id": sandbox_id,
        "session_id": None,
        "tags": tags,
        "created_at": time.time(),
        "owner_pid": owner_pid,
        "owner_start": owner_start,
        "pid": None,
        "pid_start": None,
        "cgroups": [],
        "workspace": None,
    }


def dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


async def test_list_reaps_entries_of_dead_owners_only(tag: str, tmp_path: object) -> None:
    state = str(tmp_path)
    os.chmod(state, 0o700)
    registry = Registry(state)
    gone = dead_pid()
    me = (os.getpid(), proc_start_time(os.getpid()))
    registry.write(entry(f"{tag}-dead", [tag], gone, 12345))
    registry.write(entry(f"{tag}-live", [tag], *me))
    registry.write(entry(f"{tag}-other", [f"{tag}-x"], gone, 12345))
    registry.write(entry(f"{tag}-reused", [tag], me[0], (me[1] or 0) + 1))  # our pid, another start: gone
    backend = LocalBackend(state_dir=state)

    listed = {i.sandbox_id: i for i in await backend.list([tag])}
    assert set(listed) == {f"{tag}-dead", f"{tag}-live", f"{tag}-reused"}
    assert listed[f"{tag}-dead"].reaped and listed[f"{tag}-dead"].status is cwa.SandboxStatus.FAILED
    assert listed[f"{tag}-reused"].reaped
    assert not listed[f"{tag}-live"].reaped and listed[f"{tag}-live"].owner_alive
    assert registry.read(f"{tag}-dead") is None and registry.read(f"{tag}-reused") is None
    assert registry.read(f"{tag}-live") is not None
    assert registry.read(f"{tag}-other") is not None  # not this list's tags

    assert all(not i.reaped for i in await backend.list())  # no tags: nothing is reaped
    assert registry.read(f"{tag}-other") is not None
    assert [i.sandbox_id for i in await backend.list([tag])] == [f"{tag}-live"]  # listed as reaped only once
