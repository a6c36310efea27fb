"""Orphans: a driver killed with SIGKILL mid-run leaves no sandbox process, and every leftover is found and swept.

The driver here is busy when it dies: a pool keeps creating replacements for
leases that end quickly (so sandboxes are being created at the moment of the
kill), one rollout runs a long command with a background child, and others are
in the middle of short execs. After the kill:

- local (bubblewrap): within 2 s no process of any of its sandboxes is left (by
  sandbox id on the command line, by the sandbox's own host uid, and by the
  marker command); ``list`` from another process then finds every one of its
  sandboxes (including those caught half-created) and ``sweep`` removes them
  with their registry entries and cgroups.
- local, ``isolation="none"``: nothing contains the commands, so they can outlive
  the driver; ``sweep`` still finds the sandboxes, kills what is left through
  their cgroups, and removes their host workspace directories.
- Kubernetes (the test API server): every pod the dead driver left carries its
  hard TTL and its labels, and a sweep from a new session leaves none.

``tests/local/test_lifecycle.py`` covers the simple case (an idle driver with two
sandboxes); this is the stronger variant.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import random
import signal
import sys
import textwrap
import uuid
from collections.abc import Callable

import anyio
import pytest
from adversarial.conftest import bwrap_problem, host_processes_matching
from guards import HANG_GUARD_SECONDS
from k8s.conftest import TEST_IMAGE, BackendFactory, k8s_server, make_backend, needs_bwrap, wait_no_pods  # noqa: F401
from k8s.server import KubeTestServer
from proctree import descendants

import cwsandbox_async as cwa
from cwsandbox_async.backends.kubernetes._options import TIMEOUT_DEFAULTS
from cwsandbox_async.backends.local import LocalBackend
from cwsandbox_async.backends.local._cgroup import CgroupManager
from cwsandbox_async.backends.local._registry import Registry, pid_alive
from cwsandbox_async.testing.contract import make_spec

LOCAL_DRIVER = textwrap.dedent(
    """
    import asyncio, sys
    import anyio
    import cwsandbox_async as cwa

    async def main():
        tag, marker, isolation = sys.argv[1:4]
        defaults = cwa.SandboxDefaults(tags=(tag,))
        async with cwa.Session(defaults, backend="local", backend_options={"isolation": isolation}) as s:
            async with cwa.SandboxPool(s, size=2, max_size=8) as pool:
                await pool.wait_ready(timeout_seconds=60)

                async def long_rollout():
                    async with pool.lease(timeout_seconds=60) as sb:
                        await sb.exec(f"sleep {marker} & sleep {marker}", timeout_seconds=3000)

                async def churn():  # short leases: the pool is always creating replacements
                    while True:
                        async with pool.lease(timeout_seconds=60) as sb:
                            await sb.exec(["sleep", "0.05"])

                async with anyio.create_task_group() as tg:
                    tg.start_soon(long_rollout)
                    for _ in range(4):
                        tg.start_soon(churn)
                    await anyio.sleep(1.0)
                    print("running", flush=True)

    asyncio.run(main())
    """
)


def processes_of_uid(uid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                line = next(x for x in f if x.startswith("Uid:"))
        except (OSError, StopIteration):
            continue
        if int(line.split()[1]) == uid:
            out.append(int(name))
    return out


def any_exists(paths: list[str]) -> bool:
    return any(os.path.exists(p) for p in paths)


async def eventually(predicate: Callable[[], bool], within: float = HANG_GUARD_SECONDS) -> None:
    """Poll another process's state (there is no event to wait on) until ``predicate`` holds."""
    with anyio.fail_after(within):
        while not predicate():  # noqa: ASYNC110
            await anyio.sleep(0.02)


def entries_of(tag: str) -> list[dict[str, object]]:
    return [e for e in Registry().read_all() if tag in (e.get("tags") or [])]


async def run_and_kill(argv: list[str], ready_marker: str | None) -> int:
    """Start a driver, wait until it says it is running (and ``ready_marker`` runs), SIGKILL it."""
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
    )
    try:
        assert proc.stdout is not None
        with anyio.fail_after(HANG_GUARD_SECONDS):
            line = await proc.stdout.readline()
            assert line == b"running\n", f"the driver did not start: {line!r}"
        if ready_marker:
            await eventually(lambda: bool(host_processes_matching(ready_marker.encode())))
        await anyio.sleep(random.uniform(0.0, 0.3))  # land the kill at an arbitrary point of the churn
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    return proc.pid


@pytest.mark.skipif(bwrap_problem() is not None, reason=str(bwrap_problem()))
async def test_a_sigkilled_busy_driver_leaves_no_sandbox_process() -> None:
    tag = f"orphans-{uuid.uuid4().hex[:8]}"
    marker = str(6000 + os.getpid() % 1000)
    owner = await run_and_kill([sys.executable, "-c", LOCAL_DRIVER, tag, marker, "auto"], f"sleep {marker}")
    await anyio.sleep(2)

    entries = entries_of(tag)
    assert len(entries) >= 3, entries  # the idle ones, the leased ones, those caught mid-create
    assert all(e["owner_pid"] == owner for e in entries)
    for e in entries:
        sid = str(e["sandbox_id"])
        assert not pid_alive(e.get("pid"), None), f"{sid}: its outer process is alive"
        assert host_processes_matching(sid.encode()) == [], f"{sid}: a process still names it"
        if isinstance(e.get("host_uid"), int):
            assert processes_of_uid(int(e["host_uid"])) == [], f"{sid}: a process still runs as its uid"  # type: ignore[call-overload]
    assert host_processes_matching(f"sleep {marker}".encode()) == []

    # Leftovers of every kind (finished, half-created) are found by list and removed by sweep.
    async with cwa.Session(cwa.SandboxDefaults(tags=(tag,)), backend="local", handle_signals=False) as s:
        found = await s.list()
        assert {i.sandbox_id for i in found} == {str(e["sandbox_id"]) for e in entries}
        assert all(i.owner_alive is False and i.owner_pid == owner for i in found)
        assert all(i.status is cwa.SandboxStatus.FAILED for i in found)
        assert sorted(await s.sweep()) == sorted(i.sandbox_id for i in found)
        assert await s.list() == []
    assert entries_of(tag) == []
    cgroups = [p for e in entries for p in e.get("cgroups") or []]  # type: ignore[attr-defined]
    assert not any_exists(cgroups)


@pytest.mark.skipif(bwrap_problem() is not None, reason=str(bwrap_problem()))
async def test_without_isolation_the_sweep_cleans_up_after_a_sigkilled_driver() -> None:
    tag = f"orphans-none-{uuid.uuid4().hex[:8]}"
    marker = str(6500 + os.getpid() % 500)
    await run_and_kill([sys.executable, "-c", LOCAL_DRIVER, tag, marker, "none"], f"sleep {marker}")
    entries = entries_of(tag)
    workspaces = [str(e["workspace"]) for e in entries if e.get("workspace")]
    assert len(workspaces) == len(entries) >= 3 and any_exists(workspaces)
    async with cwa.Session(cwa.SandboxDefaults(tags=(tag,)), backend="local", handle_signals=False) as s:
        assert len(await s.sweep()) == len(entries)
    assert entries_of(tag) == []
    assert not any_exists(workspaces)
    if CgroupManager().available:  # the cgroup is what still holds the orphaned commands
        await eventually(lambda: not host_processes_matching(f"sleep {marker}".encode()))
    else:  # nothing can find them: clean up what this test started, and say so
        for pid in host_processes_matching(f"sleep {marker}".encode()):
            os.kill(pid, signal.SIGKILL)
        pytest.skip("no writable cgroup here: commands of an unisolated sandbox can outlive a SIGKILLed driver")


@pytest.mark.skipif(bwrap_problem() is not None, reason=str(bwrap_problem()))
async def test_a_forgotten_live_sandbox_is_found_and_swept_by_age() -> None:
    """A sandbox whose owner is alive but lost track of it (no destroy was ever called)."""
    tag = f"orphans-live-{uuid.uuid4().hex[:8]}"
    forgetful = LocalBackend()
    spec = make_spec(tag)
    try:
        await forgetful.create(spec)
        pid = Registry().read(spec.sandbox_id)["pid"]  # type: ignore[index]
        async with cwa.Session(cwa.SandboxDefaults(tags=(tag,)), backend="local", handle_signals=False) as s:
            [info] = await s.list()
            assert info.status is cwa.SandboxStatus.RUNNING and info.owner_alive is True
            assert await s.sweep(older_than_seconds=3600) == []  # too young for that sweep
            assert await s.sweep(older_than_seconds=0.001) == [spec.sandbox_id]
            assert await s.list() == []
        await eventually(lambda: not pid_alive(pid, None))
    finally:
        await forgetful.aclose()


def open_fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


def processes_naming(ids: list[str]) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if any(i.encode() in cmdline for i in ids):
            out.append(int(name))
    return out


@pytest.mark.skipif(bwrap_problem() is not None, reason=str(bwrap_problem()))
async def test_a_create_cancelled_at_any_moment_leaves_no_process() -> None:
    """A pool closing, a lease deadline, a Ctrl-C: creates get cancelled mid-spawn. Whatever the moment,
    destroy must leave nothing, because once its registry entry is gone no sweep can find a survivor.
    (A start takes ~70 ms here; cancelling in the first 30 ms hits the spawn itself.)"""
    tag = f"orphans-cancel-{uuid.uuid4().hex[:8]}"
    backend = LocalBackend()
    ids: list[str] = []
    uids: set[int] = set()
    rng = random.Random(7)
    fds = open_fds()
    try:
        for _ in range(200):
            spec = make_spec(tag)
            ids.append(spec.sandbox_id)
            with anyio.move_on_after(rng.uniform(0.0, 0.03)):
                await backend.create(spec)
            box = backend._boxes.get(spec.sandbox_id)
            if box is not None and box.host_uid not in (None, 0, os.getuid()):
                uids.add(box.host_uid)
            with anyio.CancelScope(shield=True), anyio.fail_after(HANG_GUARD_SECONDS):
                await backend.destroy(spec.sandbox_id)
        await anyio.sleep(2)
        assert processes_naming(ids) == [], "a cancelled create left processes that no registry entry names"
        assert [p for uid in uids for p in processes_of_uid(uid)] == [], "a process of a destroyed sandbox runs on"
        template = backend._template
        if template is not None and template.pid is not None:  # the template itself (Z) is its only child
            assert len(descendants(template.pid)) == 1, "the template still holds a sandbox"
        assert entries_of(tag) == []
    finally:
        for pid in processes_naming(ids):  # do not leave them on the machine whatever the outcome
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        await backend.aclose()
        gc.collect()  # leaked pipe objects warn here, in this test, not in whichever test runs next
    assert open_fds() <= fds, "cancelled creates left file descriptors open"


K8S_DRIVER = textwrap.dedent(
    """
    import asyncio, sys
    import anyio
    import cwsandbox_async as cwa

    async def main():
        url, tag, image, marker = sys.argv[1:5]
        options = {"server": url, "image": image, "namespace": "default"}
        defaults = cwa.SandboxDefaults(tags=(tag,), max_lifetime_seconds=None)  # the backend's default TTL
        async with cwa.Session(defaults, backend="kubernetes", backend_options=options) as s:
            async with cwa.SandboxPool(s, size=3, max_size=6) as pool:
                await pool.wait_ready(timeout_seconds=60)

                async def rollout():
                    async with pool.lease(timeout_seconds=60) as sb:
                        await sb.exec(["sleep", marker], timeout_seconds=3000)

                async with anyio.create_task_group() as tg:
                    for _ in range(2):
                        tg.start_soon(rollout)
                    await anyio.sleep(1.0)
                    print("running", flush=True)

    asyncio.run(main())
    """
)


@needs_bwrap
async def test_pods_of_a_sigkilled_driver_carry_ttl_and_labels_and_are_swept(
    k8s_server: KubeTestServer,  # noqa: F811
    make_backend: BackendFactory,  # noqa: F811
) -> None:
    tag = f"orphans-k8s-{uuid.uuid4().hex[:8]}"
    marker = str(8000 + os.getpid() % 1000)
    argv = [sys.executable, "-c", K8S_DRIVER, k8s_server.url, tag, TEST_IMAGE, marker]
    await run_and_kill(argv, f"sleep {marker}")
    left = k8s_server.live_pods()
    assert len(left) >= 3, left
    for name in left:
        pod = k8s_server.pod(name)
        meta, spec = pod["metadata"], pod["spec"]
        # the hard TTL, even with max_lifetime_seconds=None: gone by itself at the latest
        assert spec["activeDeadlineSeconds"] == TIMEOUT_DEFAULTS["default_lifetime_seconds"], name
        labels = meta["labels"]
        assert labels["app.kubernetes.io/managed-by"] == "cwsandbox-async"
        assert labels.get("cwsandbox.io/session") and labels.get("cwsandbox.io/driver")
        assert any(k.startswith("tag.cwsandbox.io/") and v == tag for k, v in labels.items())
        assert tag in json.loads(meta["annotations"]["cwsandbox.io/tags"])
    # As on a real cluster, the dead driver's closed exec sockets did not stop its commands...
    assert host_processes_matching(f"sleep {marker}".encode())
    async with cwa.Session(cwa.SandboxDefaults(tags=(tag,)), backend=make_backend(), handle_signals=False) as s:
        assert {i.sandbox_id for i in await s.list()} == set(left)
        assert sorted(await s.sweep()) == sorted(left)
    await wait_no_pods(k8s_server)
    # ... deleting the pods did.
    await eventually(lambda: not host_processes_matching(f"sleep {marker}".encode()))
