"""Limits that must hold on the local backend: processes, memory, output, time, leftovers."""

from __future__ import annotations

import asyncio
import os
import time

import anyio
import pytest
from guards import HANG_GUARD_SECONDS

import cwsandbox_async as cwa
from cwsandbox_async.backends.local import LocalBackend

from .conftest import (
    exists,
    host_processes_matching,
    local_session,
    read_text,
    requires_isolation,
    wait_until,
)

pytestmark = requires_isolation

FORK_COUNT = """
import os, time
n = 0
while True:
    try:
        pid = os.fork()
    except OSError as e:
        print(n, e.errno)
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    n += 1
"""


async def host_true_works() -> bool:
    proc = await asyncio.create_subprocess_exec("true")
    return await proc.wait() == 0


async def test_fork_bomb_is_contained(tag: str) -> None:
    async with local_session(tag, resources=cwa.Resources(pids=40)) as s:
        bombed, other = await s.sandbox(), await s.sandbox()
        r = await bombed.exec(["python3", "-c", FORK_COUNT], timeout_seconds=HANG_GUARD_SECONDS)
        count, errno = (int(x) for x in r.stdout.split())
        assert errno == 11 and count < 60, r  # EAGAIN well before the limit's slack is gone
        # A classic shell bomb ends with a result, within its timeout.
        r = await bombed.exec("b() { b | b & }; b; sleep 1; echo bomb done", timeout_seconds=10)
        # It ends with a result, well within its timeout: "bomb done", or dash's own exit 2 when the bomb
        # still held every process slot at the moment the shell itself had to fork `sleep` (a race).
        assert not r.timed_out and (r.stdout.endswith("bomb done\n") or (r.returncode == 2 and "fork" in r.stderr))
        assert (await other.exec(["echo", "fine"])).stdout == "fine\n"
        assert (await bombed.exec(["echo", "alive"])).stdout == "alive\n"
        assert await host_true_works()
        leftovers = await bombed.exec("ls /proc | grep -c '^[0-9]'")
        assert int(leftovers.stdout) < 10


async def test_memory_bomb_is_contained(tag: str) -> None:
    async with local_session(tag, resources=cwa.Resources(memory_mib=128)) as s:
        bombed, other = await s.sandbox(), await s.sandbox()
        r = await bombed.exec(
            ["python3", "-c", "x = bytearray(1 << 30); print('survived')"], timeout_seconds=HANG_GUARD_SECONDS
        )
        assert r.returncode != 0 and "survived" not in r.stdout
        r = await bombed.run_python("x = [bytearray(1 << 20) for _ in range(1024)]\nprint('survived')")
        assert r.returncode != 0 and "survived" not in r.stdout
        assert (await other.exec(["echo", "fine"])).stdout == "fine\n"
        assert (await bombed.exec(["echo", "alive"])).stdout == "alive\n"
        assert await host_true_works()


async def test_a_host_out_of_memory_kills_sandboxes_first(tag: str) -> None:
    # Every process of a sandbox has the highest OOM score (its commands, what they start, its PID 1);
    # it was once set in each fork before its execve, where the write is refused (not dumpable).
    async with local_session(tag) as s:
        sb = await s.sandbox()
        r = await sb.exec(["sh", "-c", "cat /proc/self/oom_score_adj; sleep 5 & cat /proc/$!/oom_score_adj; kill $!"])
        assert r.stdout.split() == ["1000", "1000"], r
        r = await sb.run_python("print(open('/proc/self/oom_score_adj').read().strip())")
        assert r.stdout == "1000\n", r


async def test_output_flood_is_cut_at_the_cap(tag: str) -> None:
    async with local_session(tag) as s:
        sb = await s.sandbox()
        r = await sb.exec(["yes"], max_output_bytes=256 * 1024, timeout_seconds=HANG_GUARD_SECONDS)
        assert r.truncated and not r.timed_out
        assert len(r.stdout_bytes) == 256 * 1024 and set(r.stdout_bytes) <= set(b"y\n")
        r = await sb.exec("head -c 100000000 /dev/urandom >&2; echo flood done >&2", max_output_bytes=4096)
        assert r.truncated and len(r.stderr_bytes) == 4096 and r.returncode == -9  # killed at the cap
        assert "yes" not in (await sb.exec(["ps", "-eo", "comm"])).stdout


async def test_timeout_kills_the_tree_and_raises(tag: str) -> None:
    async with local_session(tag) as s:
        sb = await s.sandbox()
        marker = f"{os.getpid() % 1000 + 1000}"
        start = time.monotonic()
        # Were TERM all it got, it would sleep for `marker` (1000+) s: ending inside the guard is the fact.
        with anyio.fail_after(HANG_GUARD_SECONDS), pytest.raises(cwa.SandboxTimeoutError) as info:
            await sb.exec(f"echo started; trap '' TERM; sleep {marker} & sleep {marker}", timeout_seconds=1)
        assert time.monotonic() - start > 0.9  # not before its timeout
        assert info.value.result is not None and info.value.result.stdout == "started\n"
        assert info.value.infrastructure is False
        assert host_processes_matching(f"sleep {marker}".encode()) == []
        assert sb.exec_stats["exec_failures"] == 1


async def test_detached_double_fork_does_not_outlive_its_exec(tag: str) -> None:
    async with local_session(tag) as s:
        sb = await s.sandbox()
        r = await sb.exec("(setsid sh -c 'sleep 3131 &' &) ; (nohup sleep 3132 >/dev/null 2>&1 &) ; echo spawned")
        assert r.stdout == "spawned\n"
        await anyio.sleep(0.2)
        assert "sleep 31" not in (await sb.exec(["ps", "-eo", "args"])).stdout
        assert host_processes_matching(b"sleep 313") == []


async def test_background_job_lives_while_its_exec_runs(tag: str) -> None:
    async with local_session(tag) as s:
        sb = await s.sandbox()
        script = "(sleep 30 &) ; sleep 0.3; ps -eo args | grep -c '^sleep 30$'"
        r = await sb.exec(script, timeout_seconds=HANG_GUARD_SECONDS)
        assert r.stdout.strip() == "1"  # the orphaned helper survived until its exec ended


async def test_cancelled_exec_kills_its_command(tag: str) -> None:
    async with local_session(tag) as s:
        sb = await s.sandbox()
        with anyio.move_on_after(0.5):
            await sb.exec(["sleep", "4242"], timeout_seconds=60)
        await wait_until(lambda: not host_processes_matching(b"sleep 4242"))
        assert (await sb.exec(["echo", "ok"])).stdout == "ok\n"


async def test_the_agent_cannot_be_killed_from_inside(tag: str) -> None:
    async with local_session(tag) as s:
        sb = await s.sandbox()
        r = await sb.exec("kill -9 1; kill -TERM 1; kill -INT 1; echo done")
        assert "done" in r.stdout
        assert (await sb.exec(["echo", "still here"])).stdout == "still here\n"


async def test_cpu_seconds_and_file_size_limits(tag: str) -> None:
    resources = cwa.Resources(cpu_seconds=1, file_size_mib=1)
    async with local_session(tag, resources=resources) as s:
        sb = await s.sandbox()
        r = await sb.exec(["python3", "-c", "while True: pass"], timeout_seconds=HANG_GUARD_SECONDS)
        assert r.returncode in (-9, -24)  # SIGXCPU, then SIGKILL at the hard limit
        # The kernel checks RLIMIT_CPU against whole clock ticks; cpu_seconds is the exact runtime.
        # Under load they part (SIGXCPU at 0.78 s of runtime in CI), so no lower bound but the verdict.
        assert r.cpu_exceeded and 0 < r.cpu_seconds < 5
        r = await sb.exec("head -c 2000000 /dev/zero > /workspace/f; echo rc=$?", timeout_seconds=HANG_GUARD_SECONDS)
        assert int((await sb.exec("stat -c %s /workspace/f")).stdout) <= 1024 * 1024
        with pytest.raises(cwa.SandboxFileError):
            await sb.write_file("/workspace/g", b"\0" * (2 * 1024 * 1024))


async def test_a_sigxcpu_death_under_rlimit_cpu_is_cpu_exceeded(tag: str) -> None:
    """SIGXCPU under the sandbox's RLIMIT_CPU is the kernel's CPU verdict, whatever the exact runtime
    says: the kernel counts whole clock ticks, and on a loaded machine a 1 s limit fired at 0.78 s of
    runtime (``cpu_exceeded`` was False). Deterministic stand-in: the command's tick clock is
    ahead of its runtime by all of it. Without a CPU limit, a SIGXCPU is just a signal."""
    async with local_session(tag, resources=cwa.Resources(cpu_seconds=20)) as s:
        r = await (await s.sandbox()).exec(["sh", "-c", "kill -XCPU $$"], timeout_seconds=HANG_GUARD_SECONDS)
        assert (r.returncode, r.cpu_exceeded) == (-24, True)
        assert r.cpu_seconds < 20
    async with local_session(tag) as s:
        r = await (await s.sandbox()).exec(["sh", "-c", "kill -XCPU $$"], timeout_seconds=HANG_GUARD_SECONDS)
        assert (r.returncode, r.cpu_exceeded) == (-24, False)


async def test_cgroup_is_created_and_removed() -> None:
    backend = LocalBackend()
    if not backend._cgroups.available:
        pytest.skip("no writable cgroup controllers here")
    async with cwa.Session(backend=backend) as s:
        sb = await s.sandbox()
        paths = list(backend._boxes[sb.sandbox_id].cgroup.paths)  # type: ignore[union-attr]
        assert paths and all(exists(p) for p in paths)
        assert backend.limits.get("pids", "").startswith("cgroup")
        procs = {int(pid) for p in paths for pid in read_text(f"{p}/cgroup.procs").split()}
        assert procs == {backend._boxes[sb.sandbox_id].pid}  # one process at rest: the sandbox's PID 1
        await sb.stop()
        assert not any(exists(p) for p in paths)


async def test_a_command_cannot_kill_its_supervisor(tag: str) -> None:
    """The process that enforces the timeout is the sandbox's PID 1 (the command's parent): a SIGKILL
    from inside is dropped, the command goes on, and its timeout still ends it and its children."""
    async with local_session(tag) as s:
        sb = await s.sandbox()
        r = await sb.exec(
            "echo before; kill -9 $PPID; kill -STOP $PPID; echo after", timeout_seconds=HANG_GUARD_SECONDS
        )
        assert (r.returncode, r.stdout) == (0, "before\nafter\n")
        with pytest.raises(cwa.SandboxTimeoutError):
            await sb.exec("kill -9 $PPID; sleep 2929", timeout_seconds=1)
        await wait_until(lambda: not host_processes_matching(b"sleep 2929"))
        assert (await sb.exec(["echo", "ok"])).stdout == "ok\n"


async def test_describe_reports_what_holds() -> None:
    backend = LocalBackend()
    try:
        info = await backend.describe()
    finally:
        await backend.aclose()
    assert info["isolation"] == "unshare" and info["agent"] == "python" and info["template"]
    if os.geteuid() == 0:
        assert info["unprivileged_host_uid"] is True
    assert set(info["cgroup_controllers"]) <= {"pids", "memory", "cpu", "cpuacct"}
