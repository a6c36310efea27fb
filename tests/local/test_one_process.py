"""A sandbox at rest is one process, its PID 1, born in one fork of the template; an idle PID 1 sleeps.

Nothing is kept for later requests: no template, no worker (each would cost 1-2 MiB per sandbox).
Every exec is one fork of PID 1, gone with its exec.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys

import anyio
import pytest
from guards import HANG_GUARD_SECONDS
from proctree import descendants

import cwsandbox_async as cwa

from .conftest import local_session, requires_isolation, wait_until

pytestmark = requires_isolation

#: ``ioctl(2)`` on a namespace file: a descriptor of the user namespace that owns it.
NS_GET_USERNS = 0xB701


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def test_a_sandbox_is_one_process_before_and_after_a_burst(tag: str) -> None:
    async with local_session(tag) as s:
        sb = await s.sandbox()
        root = s.backend._boxes[sb.sandbox_id].pid  # type: ignore[attr-defined]
        assert root is not None
        assert descendants(root) == set()  # born: PID 1 only
        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(sb.exec, ["sleep", "0.3"])
            tg.start_soon(sb.run_python, "import time; time.sleep(0.3)")
            await anyio.sleep(0.15)
            assert len(descendants(root)) >= 5  # one process per exec while they run
        await wait_until(lambda: descendants(root) == set())
        await sb.write_file("/workspace/f", b"x")
        assert await sb.read_file("/workspace/f") == b"x"
        assert descendants(root) == set()  # file helpers are gone with their operation too


def ns_inode(pid: int, kind: str) -> int:
    return os.stat(f"/proc/{pid}/ns/{kind}").st_ino


def pid_ns_owner(pid: int) -> int:
    """The inode of the user namespace owning ``pid``'s pid namespace."""
    fd = os.open(f"/proc/{pid}/ns/pid", os.O_RDONLY)
    try:
        owner = fcntl.ioctl(fd, NS_GET_USERNS)
    finally:
        os.close(fd)
    try:
        return os.fstat(owner).st_ino
    finally:
        os.close(owner)


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("PPid:")).split()[1])


async def test_a_sandbox_is_born_in_one_fork_of_the_template(tag: str) -> None:
    """PID 1 is the template's own child, born into a pid namespace the template made for it: one owned
    by the template's user namespace. A newborn that made the pid namespace itself, in the sandbox's
    user namespace, and then forked PID 1 into it (a second fork) would leave it owned by the sandbox's."""
    async with local_session(tag) as s:
        sb = await s.sandbox()
        root = s.backend._boxes[sb.sandbox_id].pid  # type: ignore[attr-defined]
        assert root is not None
        template = parent_of(root)  # the template proper, Z, a child of the process the driver started
        assert parent_of(template) == s.backend._template.pid  # type: ignore[attr-defined]
        assert ns_inode(root, "pid") != ns_inode(template, "pid")
        assert ns_inode(root, "user") != ns_inode(template, "user")
        assert pid_ns_owner(root) == ns_inode(template, "user")
        # Its /proc is its own pid namespace's, and stays: a mount locked in its mount namespace.
        r = await sb.exec(["sh", "-c", "umount /proc || echo refused"])
        assert r.stdout == "refused\n"
        assert (await sb.exec(["cat", "/proc/1/status"])).stdout.count("NSpid:\t1\n") == 1


#: Run in the user namespace of the pid given as argv[1] (a fresh, single-threaded interpreter, as
#: ``setns`` into a user namespace needs): set its limit of pid namespaces to argv[2].
SET_PID_NS_LIMIT = (
    "import ctypes, os, sys\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "fd = os.open(f'/proc/{sys.argv[1]}/ns/user', os.O_RDONLY)\n"
    "if libc.setns(fd, 0x10000000) != 0:\n"  # CLONE_NEWUSER
    "    raise OSError(ctypes.get_errno(), 'setns')\n"
    "with open('/proc/sys/user/max_pid_namespaces', 'w') as f:\n"
    "    f.write(sys.argv[2])\n"
)


def set_pid_ns_limit(pid: int, limit: int) -> None:
    r = subprocess.run(
        [sys.executable, "-I", "-S", "-c", SET_PID_NS_LIMIT, str(pid), str(limit)],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_SECONDS,
    )
    assert r.returncode == 0, r.stderr


async def test_a_template_refused_a_pid_namespace_says_why_and_serves_the_next(tag: str) -> None:
    """At its user namespace's limit of pid namespaces, the template cannot make the next sandbox's:
    the create fails with the kernel's reason, the template stays, and the next create works."""
    async with local_session(tag) as s:
        first = await s.sandbox()
        root = s.backend._boxes[first.sandbox_id].pid  # type: ignore[attr-defined]
        assert root is not None
        template = parent_of(root)
        set_pid_ns_limit(template, 1)  # the one it made already
        try:
            with anyio.fail_after(HANG_GUARD_SECONDS), pytest.raises(cwa.SandboxCreationError) as info:
                await s.sandbox()
        finally:
            set_pid_ns_limit(template, 1 << 20)
        assert "could not make a pid namespace" in str(info.value), info.value
        assert "No space left on device" in str(info.value), info.value  # the kernel's ENOSPC
        assert parent_of(root) == template  # the same template, still serving
        with anyio.fail_after(HANG_GUARD_SECONDS):
            second = await s.sandbox()
            assert (await second.exec(["echo", "born"])).stdout == "born\n"
        assert parent_of(s.backend._boxes[second.sandbox_id].pid) == template  # type: ignore[attr-defined]


async def test_an_idle_pid_1_uses_no_cpu(tag: str) -> None:
    async with local_session(tag) as s:
        sb = await s.sandbox()
        root = s.backend._boxes[sb.sandbox_id].pid  # type: ignore[attr-defined]
        assert (await sb.exec(["sh", "-c", "kill -STOP 1; kill -CHLD 1; true"])).returncode == 0
        before = cpu_seconds(root)
        await anyio.sleep(1.5)
        assert cpu_seconds(root) - before < 0.2
        assert (await sb.run_python("print('still serves')")).stdout == "still serves\n"
