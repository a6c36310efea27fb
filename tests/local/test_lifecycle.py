"""Local sandbox lifecycle: crashes of the driver and of the agent, leaks, concurrency, bad input."""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import signal
import sys
import textwrap
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from guards import HANG_GUARD_SECONDS, LONG_SECONDS

import cwsandbox_async as cwa
from cwsandbox_async.backends import load_backend
from cwsandbox_async.backends.local import LocalBackend
from cwsandbox_async.backends.local._registry import Registry, pid_alive
from cwsandbox_async.testing.contract import make_request, make_spec

from .conftest import (
    child_pids,
    exists,
    host_processes_matching,
    local_session,
    open_fds,
    requires_isolation,
    wait_until,
)

pytestmark = requires_isolation

DRIVER = textwrap.dedent(
    """
    import asyncio, json, sys
    import cwsandbox_async as cwa

    async def main():
        session = cwa.Session(cwa.SandboxDefaults(tags=(sys.argv[1],)), backend="local")
        await session.open()
        boxes = [await session.sandbox() for _ in range(2)]
        backend = session.backend
        info = {
            "ids": [b.sandbox_id for b in boxes],
            "pids": [backend._boxes[b.sandbox_id].pid for b in boxes],
            "cgroups": [p for b in boxes for p in (backend._boxes[b.sandbox_id].cgroup.paths
                        if backend._boxes[b.sandbox_id].cgroup else [])],
            "template": backend._template.pid,
        }
        print(json.dumps(info), flush=True)
        await boxes[1].exec(["sleep", sys.argv[2]], timeout_seconds=3000)

    asyncio.run(main())
    """
)


async def test_sigkilled_driver_leaves_no_process_and_sweep_cleans_up(tag: str) -> None:
    marker = str(5000 + os.getpid() % 1000)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", DRIVER, tag, marker, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        with anyio.fail_after(HANG_GUARD_SECONDS):
            info = json.loads(await proc.stdout.readline())
        await wait_until(lambda: bool(host_processes_matching(f"sleep {marker}".encode())))
    finally:
        proc.kill()
        await proc.wait()
    await anyio.sleep(2)
    assert not pid_alive(info["template"], None), "the template outlived its driver"
    assert not any(pid_alive(pid, None) for pid in info["pids"])
    for sid in info["ids"]:
        assert host_processes_matching(sid.encode()) == []
    assert host_processes_matching(f"sleep {marker}".encode()) == []

    async with local_session(tag) as s:
        found = await s.list([tag])
        assert sorted(i.sandbox_id for i in found) == sorted(info["ids"])
        assert all(i.owner_alive is False and i.status is cwa.SandboxStatus.FAILED and not i.reaped for i in found)
        swept = await s.sweep([tag])
        assert sorted(swept) == sorted(info["ids"])
        assert await s.list([tag]) == []
    assert not any(exists(p) for p in info["cgroups"])


async def test_list_and_destroy_a_live_sandbox_of_another_backend(tag: str) -> None:
    owner, other = LocalBackend(), LocalBackend()
    spec = make_spec(tag)
    try:
        await owner.create(spec)
        [info] = await other.list([tag])
        assert (info.sandbox_id, info.status, info.owner_alive) == (spec.sandbox_id, cwa.SandboxStatus.RUNNING, True)
        assert await other.status(spec.sandbox_id) is cwa.SandboxStatus.RUNNING
        await other.destroy(spec.sandbox_id)
        await wait_until(lambda: owner._boxes[spec.sandbox_id].runner.channel.exited.is_set())  # type: ignore[union-attr]
        assert await owner.status(spec.sandbox_id) is cwa.SandboxStatus.FAILED
        assert await other.list([tag]) == []
    finally:
        await owner.destroy(spec.sandbox_id)
        await owner.aclose()


async def test_no_fd_process_task_or_thread_leaks(tag: str) -> None:
    async def cycle() -> None:
        async with local_session(tag) as s:
            async with s.sandbox() as sb:
                assert (await sb.exec(["echo", "x"])).stdout == "x\n"
                assert (await sb.run_python("print(6 * 7)")).stdout == "42\n"
                await sb.write_file("/workspace/f", b"data")
                assert await sb.read_file("/workspace/f") == b"data"
                with anyio.move_on_after(0.3):
                    await sb.exec(["sleep", "30"])
            failed = await s.sandbox()  # stopped by the session, not by the test
            await failed.exec(["true"])

    await cycle()  # warm-up: the isolation probe and lazy imports happen once
    fds, kids, tasks = open_fds(), child_pids(), len(asyncio.all_tasks())
    threads = threading.active_count()
    for _ in range(3):
        await cycle()
    await wait_until(lambda: threading.active_count() <= threads)  # asyncio's child watcher threads end
    assert open_fds() == fds
    assert child_pids() == kids
    assert len(asyncio.all_tasks()) == tasks
    assert await LocalBackend().list([tag]) == []


async def test_concurrent_execs_in_one_sandbox(tag: str) -> None:
    async with local_session(tag) as s:
        sb = await s.sandbox()
        results: dict[int, str] = {}

        # A barrier: each exec waits inside the sandbox until all 16 have started, so they finish only
        # if they run at once (one at a time, the first would wait out its timeout), at any load.
        barrier = "touch /tmp/up.{i}; until [ $(ls /tmp | grep -c '^up\\.') -ge 16 ]; do sleep 0.02; done"

        async def one(i: int) -> None:
            r = await sb.exec(barrier.format(i=i) + f"; echo {i}; echo err{i} >&2", timeout_seconds=HANG_GUARD_SECONDS)
            results[i] = r.stdout + r.stderr

        with anyio.fail_after(HANG_GUARD_SECONDS):
            async with anyio.create_task_group() as tg:
                for i in range(16):
                    tg.start_soon(one, i)
        assert results == {i: f"{i}\nerr{i}\n" for i in range(16)}
        assert sb.exec_stats["exec_completed_ok"] == 16


async def test_streaming_output_with_process(tag: str) -> None:
    async with local_session(tag) as s:
        sb = await s.sandbox()
        chunks = []
        async with sb.process("for i in 1 2 3; do echo $i; sleep 0.1; done") as p:
            async for chunk in p.stdout:
                chunks.append(chunk)
            result = await p.wait()
        assert b"".join(chunks) == b"1\n2\n3\n" and len(chunks) >= 2
        assert result.returncode == 0


async def test_agent_death_fails_pending_execs(tag: str) -> None:
    async with local_session(tag) as s:
        sb = await s.sandbox()
        pid = s.backend._boxes[sb.sandbox_id].pid  # type: ignore[attr-defined]

        async def kill_soon() -> None:
            await anyio.sleep(0.3)
            os.kill(pid, signal.SIGKILL)

        async with anyio.create_task_group() as tg:
            tg.start_soon(kill_soon)
            with pytest.raises(cwa.SandboxNotRunningError) as info:
                await sb.exec(["sleep", "30"])
        assert info.value.infrastructure
        assert sb.status is cwa.SandboxStatus.FAILED
        with pytest.raises(cwa.SandboxNotRunningError):
            await sb.exec(["true"])
        assert await sb.refresh_status() is cwa.SandboxStatus.FAILED
    assert await LocalBackend().list([tag]) == []


async def test_max_lifetime_ends_the_sandbox(tag: str) -> None:
    async with local_session(tag, max_lifetime_seconds=1.0) as s:
        sb = await s.sandbox()
        with anyio.fail_after(HANG_GUARD_SECONDS), pytest.raises(cwa.SandboxNotRunningError):
            await sb.exec(["sleep", str(LONG_SECONDS)], timeout_seconds=LONG_SECONDS)


async def test_bad_inputs_are_validation_errors(tag: str) -> None:
    async with local_session(tag) as s:
        sb = await s.sandbox()
        bad_calls = [
            sb.exec([]),
            sb.exec(["echo", "a\x00b"]),
            sb.exec(["echo", 3]),  # type: ignore[list-item]
            sb.exec(["true"], timeout_seconds=-1),
            sb.exec(["true"], cwd="relative"),
            sb.exec(["true"], env={"BAD NAME": "x"}),
            sb.exec(["true"], max_output_bytes=0),
            sb.read_file("relative/path"),
            sb.write_file("/workspace/a\x00b", b"x"),
            sb.run_python("print(1)\x00"),
            sb.run_python(123),  # type: ignore[arg-type]
        ]
        for call in bad_calls:
            with pytest.raises(cwa.SandboxValidationError):
                await call
        assert sb.exec_stats["exec_count"] == 0
        with pytest.raises(cwa.SandboxValidationError):
            await s.sandbox(working_dir="/")
    bad_options: list[dict[str, object]] = [
        {"isolation": "bogus"},
        {"sandbox_uid": 0},
        {"expose": ["relative"]},
        {"hide": ["/"]},
        {"isolation": "bwrap", "agent": "python"},
        {"cpu_weight": 0},
        {"exit_grace_seconds": 0},
        {"eof_grace_seconds": -1.0},
        {"plain_file_timeout_seconds": float("nan")},
        {"no_such_option": 1.0},
    ]
    for options in bad_options:
        with pytest.raises(cwa.SandboxValidationError):
            load_backend("local", **options)
    assert LocalBackend(exit_grace_seconds=None).options.exit_grace == 0.5  # None: the default
    assert LocalBackend(eof_grace_seconds=math.inf).options.eof_grace == math.inf
    backend = LocalBackend()
    with pytest.raises(cwa.SandboxValidationError):
        await backend.create(
            make_spec(tag).__class__(sandbox_id="../evil", session_id="x", defaults=cwa.SandboxDefaults())
        )


async def test_registry_entries_follow_the_sandbox(tag: str) -> None:
    registry = Registry()
    async with local_session(tag) as s:
        sb = await s.sandbox()
        entry = registry.read(sb.sandbox_id)
        assert entry is not None and entry["owner_pid"] == os.getpid() and entry["tags"] == [tag]
        assert pid_alive(entry["pid"], entry["pid_start"])
        st = os.stat(registry.dir)
        assert st.st_uid == os.getuid() and st.st_mode & 0o077 == 0
    assert registry.read(sb.sandbox_id) is None


async def test_no_isolation_only_by_name_and_with_a_warning(tag: str) -> None:
    with pytest.warns(RuntimeWarning, match="NOT isolated"):
        backend = LocalBackend(isolation="none")
    assert backend.isolation == "none"
    async with cwa.Session(cwa.SandboxDefaults(tags=(tag,)), backend=backend) as s:
        sb = await s.sandbox()
        await sb.write_file("/workspace/hello.txt", b"hi")
        r = await sb.exec(["cat", "hello.txt"])
        assert r.stdout == "hi"
        assert (await sb.run_python("print(7)")).stdout == "7\n"
    assert LocalBackend().isolation == "unshare" and LocalBackend(agent="plain").isolation == "bwrap"


@pytest.mark.filterwarnings("ignore:LocalBackend\\(isolation='none'\\)")
@pytest.mark.parametrize("isolation", ["none", "unshare"])
async def test_a_command_gets_no_descriptor_but_its_own(tag: str, isolation: str) -> None:
    """Not the agent's channel (which the unisolated agent got by dup2, so inheritable), nor anything
    inheritable the driver's process holds (here a pipe; under make, its jobserver's)."""
    r, w = os.pipe()
    os.set_inheritable(w, True)
    try:
        async with cwa.Session(cwa.SandboxDefaults(tags=(tag,)), backend=LocalBackend(isolation=isolation)) as s:
            sb = await s.sandbox()
            res = await sb.exec(
                ["sh", "-c", 'for f in /proc/$$/fd/*; do [ -e "$f" ] && echo "${f##*/}"; done']
            )  # (not the glob's own)
            assert sorted(res.stdout.split()) == ["0", "1", "2"], res.stdout
    finally:
        os.close(r)
        os.close(w)


@pytest.fixture
async def fixture_sandbox(tag: str) -> AsyncIterator[tuple[LocalBackend, str]]:
    """A sandbox created in a fixture: the template is started from a worker thread that ends before the test."""
    backend = LocalBackend()
    spec = make_spec(tag)
    await backend.create(spec)
    yield backend, spec.sandbox_id
    await backend.destroy(spec.sandbox_id)
    await backend.aclose()


async def test_the_template_outlives_the_thread_that_started_it(fixture_sandbox: tuple[LocalBackend, str]) -> None:
    backend, sid = fixture_sandbox
    r = await backend.exec(sid, make_request("echo", "hi"))
    assert r.returncode == 0 and r.stdout == b"hi\n"
    assert backend._template is not None and backend._template.alive


async def test_a_dead_template_is_replaced_and_its_sandboxes_fail_cleanly(tag: str) -> None:
    async with local_session(tag) as s:
        old = await s.sandbox()
        backend = s.backend
        template = backend._template  # type: ignore[attr-defined]
        assert template is not None and template.pid is not None
        os.kill(template.pid, signal.SIGKILL)  # the outer process: the template and every sandbox die with it
        await wait_until(lambda: not template.alive)
        with pytest.raises(cwa.SandboxNotRunningError) as info:
            await old.exec(["true"])
        assert info.value.infrastructure  # the machinery died: nothing the program did
        new = await s.sandbox()  # a new template starts for it
        assert (await new.exec(["echo", "born again"])).stdout == "born again\n"
        assert backend._template is not template  # type: ignore[attr-defined]
    assert await LocalBackend().list([tag]) == []


CHECKOUT_DRIVER = textwrap.dedent(
    """
    import asyncio, sys
    import cwsandbox_async as cwa
    from cwsandbox_async.backends.local import _template

    async def main():
        assert _template.AGENT_DIR.startswith(sys.argv[1]), _template.AGENT_DIR
        async with cwa.Session(backend="local", backend_options={"isolation": "unshare"}) as s:
            sb = await s.sandbox()
            r = await sb.exec("ls /run/cwsandbox/cwsandbox_agent/_birth.py")
            print(r.stdout or r.stderr, end="")
            print((await sb.run_python("print(6 * 7)")).stdout, end="")

    asyncio.run(main())
    """
)


async def test_a_checkout_under_tmp_still_binds_its_agent_package(tmp_path: Path) -> None:
    """The template stages its root on /tmp: a package that lives under /tmp must still be bound."""
    copy = tmp_path / "checkout"
    shutil.copytree(Path(cwa.__file__).parent, copy / "cwsandbox_async", ignore=shutil.ignore_patterns("__pycache__"))
    proc = await anyio.run_process(
        [sys.executable, "-c", CHECKOUT_DRIVER, str(copy)],
        env={**os.environ, "PYTHONPATH": str(copy)},
        cwd=str(tmp_path),  # not this checkout: "" comes first on sys.path
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    assert proc.stdout.decode() == "/run/cwsandbox/cwsandbox_agent/_birth.py\n42\n"
