"""SIGTERM: twice during close, the driver still closes within its bound, leaves nothing, and dies of SIGTERM;
and an application's own SIGTERM handler is never replaced.

A real driver process on the local backend. The first SIGTERM cancels the
session's body; while the session closes (a closer that takes a second stands
for a pool letting its leases finish), a second SIGTERM arrives. It must not cut
the close short: every sandbox is stopped (no process, no registry entry, no
cgroup left), the close ends within ``Timeouts.close_seconds``, and the process
then exits by SIGTERM.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import textwrap
import time
import uuid

import anyio
import pytest
from guards import HANG_GUARD_SECONDS
from local.conftest import exists, local_session, requires_isolation

import cwsandbox_async as cwa
from cwsandbox_async.backends.local._registry import pid_alive
from cwsandbox_async.testing import FakeBackend

CLOSE_SECONDS = 10.0
CLOSER_SECONDS = 1.0

DRIVER = textwrap.dedent(
    """
    import asyncio, json, sys
    import anyio
    import cwsandbox_async as cwa

    async def main():
        tag, close_seconds, closer_seconds = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
        timeouts = cwa.Timeouts(close_seconds=close_seconds)
        async with cwa.Session(cwa.SandboxDefaults(tags=(tag,)), backend="local", timeouts=timeouts) as s:
            boxes = [await s.sandbox() for _ in range(3)]

            async def slow_closer():  # like a pool letting its leases finish
                print("closing", flush=True)
                with s.close_budget.shielded():
                    await anyio.sleep(closer_seconds)

            s.add_closer(slow_closer)
            inner = s.backend._boxes
            print(json.dumps({
                "ids": [b.sandbox_id for b in boxes],
                "pids": [inner[b.sandbox_id].pid for b in boxes],
                "cgroups": [p for b in boxes for p in (inner[b.sandbox_id].cgroup.paths
                            if inner[b.sandbox_id].cgroup else [])],
            }), flush=True)
            await anyio.sleep_forever()

    asyncio.run(main())
    """
)


@requires_isolation
async def test_a_second_sigterm_during_close_neither_cuts_it_short_nor_leaks() -> None:
    tag = f"sigterm-{uuid.uuid4().hex[:8]}"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        DRIVER,
        tag,
        str(CLOSE_SECONDS),
        str(CLOSER_SECONDS),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        with anyio.fail_after(HANG_GUARD_SECONDS):
            info = json.loads(await proc.stdout.readline())
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        with anyio.fail_after(HANG_GUARD_SECONDS):
            assert (await proc.stdout.readline()).strip() == b"closing"
        proc.send_signal(signal.SIGTERM)  # during the close
        with anyio.fail_after(CLOSE_SECONDS + 10):
            code = await proc.wait()
        took = time.monotonic() - signalled
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.stderr is not None
    stderr = (await proc.stderr.read()).decode(errors="replace")
    assert code == -signal.SIGTERM, stderr
    assert CLOSER_SECONDS <= took < CLOSE_SECONDS + 2, f"the close took {took:.2f} s"
    assert not any(pid_alive(pid, None) for pid in info["pids"]), "a sandbox process outlived the close"
    assert not any(exists(p) for p in info["cgroups"]), "a sandbox cgroup outlived the close"
    async with local_session(tag) as s:
        assert await s.list([tag]) == [], "a registry entry outlived the close"


async def test_an_applications_own_sigterm_handler_is_left_alone() -> None:
    """With a handler of the application's installed, the session installs none and SIGTERM is the app's."""
    got: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
    try:
        async with cwa.Session(backend=FakeBackend()) as s:
            os.kill(os.getpid(), signal.SIGTERM)
            await anyio.sleep(0.05)  # the body goes on: the session did not take SIGTERM over
            assert got == [signal.SIGTERM]
            assert s.state.value == "open"
        assert not isinstance(signal.getsignal(signal.SIGTERM), int), "the app's handler is still in place"
    finally:
        signal.signal(signal.SIGTERM, previous)


async def test_sigterm_cancels_the_session_body_and_the_process_would_die_of_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In process: the handler cancels the body, the session closes, then the pending SIGTERM is re-raised.
    The re-raise is replaced here by a recorder, so the test process lives."""
    died: list[str] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: died.append(f"{pid}:{sig}"))
    backend = FakeBackend()
    reached_end = False
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    async with cwa.Session(backend=backend) as s:
        await s.sandbox()
        signal.raise_signal(signal.SIGTERM)  # handled on the loop: cancels this body at its next await
        await anyio.sleep(10)
        reached_end = True
    assert not reached_end and backend.live == 0 and s.state.value == "closed"
    assert died == [f"{os.getpid()}:{signal.SIGTERM}"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored for the re-raise


async def test_nested_sessions_each_get_sigterm_and_the_handler_is_restored_in_any_exit_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Scoped like trio's open_signal_receiver: each session's block installs a handler over the one before
    and puts it back; one SIGTERM cancels every open session's body; the process dies once, after the last
    session out, not when the first one leaves (out of order here: the first one entered leaves first)."""
    died: list[int] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: died.append(sig))
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    first, second = cwa.Session(backend=FakeBackend()), cwa.Session(backend=FakeBackend())
    entered = {id(first): anyio.Event(), id(second): anyio.Event()}
    first_out = anyio.Event()
    handlers: list[object] = []
    reached_end: list[cwa.Session] = []

    async def hold_until_first_is_out() -> None:
        await first_out.wait()  # a closer runs shielded: the second session leaves after the first

    async def run(s: cwa.Session) -> None:
        async with s:
            handlers.append(signal.getsignal(signal.SIGTERM))
            if s is second:
                s.add_closer(hold_until_first_is_out)
            entered[id(s)].set()
            await anyio.sleep(30)
            reached_end.append(s)
        if s is first:
            assert died == [], "the first session out must not die: another is still open"
            assert signal.getsignal(signal.SIGTERM) is handlers[1], "the later handler stays in place"
            first_out.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run, first)
        await entered[id(first)].wait()
        tg.start_soon(run, second)
        await entered[id(second)].wait()
        assert handlers[0] is not handlers[1]
        signal.raise_signal(signal.SIGTERM)  # reaches both: the second's handler calls the first's
    assert reached_end == [] and first.state.value == second.state.value == "closed"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert died == [signal.SIGTERM]
