"""The registry: a new run of a driver reaps what dead drivers of its kind left (never a live owner's)."""

from __future__ import annotations

import os
import subprocess
import time

import cwsandbox_async as cwa
from cwsandbox_async.backends.local import LocalBackend
from cwsandbox_async.backends.local._registry import Registry, proc_start_time

from .conftest import requires_isolation

pytestmark = requires_isolation


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


async def test_the_first_create_with_a_tag_reaps_dead_owners_entries_only(tag: str, tmp_path: object) -> None:
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
    try:
        listed = {i.sandbox_id: i for i in await backend.list([tag])}  # list only reads
        assert set(listed) == {f"{tag}-dead", f"{tag}-live", f"{tag}-reused"} and not any(
            i.reaped for i in listed.values()
        )
        assert registry.read(f"{tag}-dead") is not None

        async with cwa.Session(cwa.SandboxDefaults(tags=(tag,)), backend=backend) as s:
            sb = await s.sandbox()  # the first create with this tag reaps the dead owners' entries
            assert registry.read(f"{tag}-dead") is None and registry.read(f"{tag}-reused") is None
            assert registry.read(f"{tag}-live") is not None  # a live owner's: never touched
            assert registry.read(f"{tag}-other") is not None  # not this run's tags
            listed = {i.sandbox_id: i for i in await s.list()}
            assert listed[f"{tag}-dead"].reaped and listed[f"{tag}-dead"].status is cwa.SandboxStatus.FAILED
            assert listed[f"{tag}-reused"].reaped
            assert not listed[f"{tag}-live"].reaped and listed[f"{tag}-live"].owner_alive
            assert not listed[sb.sandbox_id].reaped
    finally:
        for name in ("live", "other"):
            registry.remove(f"{tag}-{name}")
        await backend.aclose()
