"""SIGTERM and SIGINT: the Session stops its sandboxes itself (registry emptied, cgroups gone), then the
driver exits as the signal demands."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import textwrap

import anyio
import pytest
from guards import HANG_GUARD_SECONDS

from cwsandbox_async.backends.local._registry import pid_alive

from .conftest import exists, host_processes_matching, local_session, requires_isolation, wait_until

pytestmark = requires_isolation

#: The drivers' close budget: what the session promises for stopping its sandboxes after the signal.
CLOSE_SECONDS = 20.0

DRIVER = textwrap.dedent(
    """
    import asyncio, json, sys
    import cwsandbox_async as cwa

    async def main():
        timeouts = cwa.Timeouts(close_seconds=float(sys.argv[3]))
        async with cwa.Session(cwa.SandboxDefaults(tags=(sys.argv[1],)), backend="local", timeouts=timeouts) as session:
            boxes = [await session.sandbox() for _ in range(3)]
            backend = session.backend
            print(json.dumps({
                "ids": [b.sandbox_id for b in boxes],
                "pids": [backend._boxes[b.sandbox_id].pid for b in boxes],
                "cgroups": [p for b in boxes for p in (backend._boxes[b.sandbox_id].cgroup.paths
                            if backend._boxes[b.sandbox_id].cgroup else [])],
            }), flush=True)
            await boxes[0].exec(["sleep", sys.argv[2]], timeout_seconds=3000)

    asyncio.run(main())
    """
)


@pytest.mark.parametrize(
    ("sig", "exit_codes"), [(signal.SIGTERM, {-signal.SIGTERM}), (signal.SIGINT, {-signal.SIGINT, 1})]
)
async def test_signal_stops_every_sandbox_through_the_session(tag: str, sig: int, exit_codes: set[int]) -> None:
    marker = str(6000 + os.getpid() % 1000 + sig)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", DRIVER, tag, marker, str(CLOSE_SECONDS),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        with anyio.fail_after(HANG_GUARD_SECONDS):
            info = json.loads(await proc.stdout.readline())
        await wait_until(lambda: bool(host_processes_matching(f"sleep {marker}".encode())))
        proc.send_signal(sig)
        with anyio.fail_after(CLOSE_SECONDS + 10):  # its close budget, then the interpreter's exit
            code = await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert code in exit_codes
    # Stopped by the session, not only by --die-with-parent: the registry is empty and the cgroups are gone.
    assert not any(pid_alive(pid, None) for pid in info["pids"])
    assert host_processes_matching(f"sleep {marker}".encode()) == []
    assert not any(exists(p) for p in info["cgroups"])
    async with local_session(tag) as s:
        assert await s.list([tag]) == []
