"""Reaching out: the network, the host's sockets and directories, other sandboxes, cgroups, disk quotas."""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import struct
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from guards import HANG_GUARD_SECONDS

import cwsandbox_async as cwa

from .conftest import arena, requires_isolation

pytestmark = requires_isolation

CONNECT = """
import socket, sys, time
family, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM if family == "udp" else socket.SOCK_STREAM)
s.settimeout(5)
start = time.monotonic()
try:
    if family == "udp":
        s.sendto(b"x", (host, port))
    else:
        s.connect((host, port))
    print("connected")
except OSError as e:
    print("blocked", e.errno, round(time.monotonic() - start, 3))
"""
ENETUNREACH = 101
HOME = os.path.expanduser("~")


def host_addresses() -> list[str]:
    """IPv4 addresses of this host's non-loopback interfaces (read from the kernel; no traffic)."""
    out = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            if name == "lo":
                continue
            try:
                packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
            except OSError:
                continue
            out.append(socket.inet_ntoa(packed[20:24]))
    return out


@contextlib.contextmanager
def listener(host: str) -> Iterator[int]:
    sock = socket.socket()
    sock.bind((host, 0))
    sock.listen(8)
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


async def test_the_outside_network_is_unreachable_at_once(tag: str) -> None:
    """No route at all: connecting out fails immediately with ENETUNREACH (nothing ever leaves the host)."""
    async with arena(tag) as a:
        for family, host in (("tcp", "1.1.1.1"), ("udp", "1.1.1.1"), ("tcp", "10.0.0.1"), ("udp", "8.8.8.8")):
            r = await a.victim.exec(["python3", "-c", CONNECT, family, host, "53"], timeout_seconds=HANG_GUARD_SECONDS)
            verdict, errno, seconds = r.stdout.split()
            assert verdict == "blocked" and int(errno) == ENETUNREACH, (family, host, r.stdout)
            assert float(seconds) < 0.5
        r = await a.victim.exec("getent hosts example.com; echo rc=$?", timeout_seconds=HANG_GUARD_SECONDS)
        assert "rc=0" not in r.stdout


async def test_the_hosts_own_addresses_are_unreachable(tag: str) -> None:
    """A server on this host's non-loopback address (not just 127.0.0.1) is out of reach too."""
    addresses = host_addresses()
    if not addresses:
        pytest.skip("this host has no non-loopback IPv4 address")
    async with arena(tag) as a:
        with listener(addresses[0]) as port:
            r = await a.victim.exec(
                ["python3", "-c", CONNECT, "tcp", addresses[0], str(port)], timeout_seconds=HANG_GUARD_SECONDS
            )
            assert r.stdout.startswith("blocked"), r
            # The control: with network=True the same program connects (a local connection), so the
            # check above can fail.
            open_box = await a.session.sandbox(network=True)
            r = await open_box.exec(
                ["python3", "-c", CONNECT, "tcp", addresses[0], str(port)], timeout_seconds=HANG_GUARD_SECONDS
            )
            assert r.stdout.strip() == "connected", r


ABSTRACT = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(b"\\0" + sys.argv[1].encode())
    print("connected")
except OSError as e:
    print("blocked", e.errno)
"""


async def test_abstract_unix_sockets_of_the_host_are_unreachable(tag: str) -> None:
    """Abstract sockets (X11, D-Bus, some agents) ignore the file system; only the net namespace hides them."""
    name = f"cwsa-test-{uuid.uuid4().hex[:8]}"
    server = socket.socket(socket.AF_UNIX)
    server.bind(b"\0" + name.encode())
    server.listen(8)
    try:
        async with arena(tag) as a:
            r = await a.victim.exec(["python3", "-c", ABSTRACT, name])
            assert r.stdout.startswith("blocked"), r
            open_box = await a.session.sandbox(network=True)  # the control
            r = await open_box.exec(["python3", "-c", ABSTRACT, name])
            assert r.stdout.strip() == "connected", r
    finally:
        server.close()


async def test_the_drivers_directories_are_absent(tag: str, tmp_path: Path) -> None:
    """The project directory, pytest's temp dirs, the registry's state dir, home: none exists inside."""
    secret = tmp_path / "api-key.txt"
    secret.write_text("sk-DRIVER-SECRET")
    async with arena(tag) as a:
        state_dir = a.session.backend._machine.registry.state_dir  # type: ignore[attr-defined]
        for path in (str(tmp_path), str(Path.cwd()), state_dir, HOME):
            r = await a.victim.exec(["ls", "-A", path])
            assert r.returncode != 0, (path, r.stdout)
            with pytest.raises(cwa.SandboxFileError):
                await a.victim.read_file(os.path.join(path, "api-key.txt"))
        r = await a.victim.exec(f"cat {secret}; grep -rs DRIVER-SECRET /tmp /workspace /dev/shm")
        assert "sk-DRIVER-SECRET" not in r.stdout


async def test_another_sandboxs_workspace_is_unreachable_through_host_paths(tag: str) -> None:
    """The host path of a sandbox's files is /proc/<its host pid>/root/...: not reachable from a sibling."""
    async with arena(tag) as a:
        await a.canary.write_file("/workspace/answer.txt", b"CANARY-PRIVATE")
        peer = a.host_pid(a.canary)
        peer_file = f"/proc/{peer}/root/workspace/answer.txt"
        r = await a.victim.exec(f"cat {peer_file}; ls /proc/{peer}")
        assert r.returncode != 0 and "CANARY-PRIVATE" not in r.stdout
        await a.victim.exec(["ln", "-s", peer_file, "/workspace/peek"])
        with pytest.raises(cwa.SandboxFileError):
            await a.victim.read_file("/workspace/peek")
        with pytest.raises(cwa.SandboxFileError):
            await a.victim.write_file("/workspace/peek", b"overwritten")
        await a.victim.exec(["ln", "-s", f"/proc/{peer}/root/workspace", "/workspace/peerdir"])
        with pytest.raises(cwa.SandboxFileError):
            await a.victim.write_file("/workspace/peerdir/planted.py", b"import os")
        assert await a.canary.read_file("/workspace/answer.txt") == b"CANARY-PRIVATE"
        assert (await a.canary.exec(["ls", "/workspace"])).stdout == "answer.txt\n"


def pids_max(paths: list[str]) -> dict[str, str]:
    return {p: Path(p, "pids.max").read_text() for p in paths if Path(p, "pids.max").exists()}


def control_files(paths: list[str]) -> list[str]:
    names = ("pids.max", "memory.limit_in_bytes", "memory.max", "cgroup.procs")
    return [f"{p}/{n}" for p in paths for n in names if os.path.exists(f"{p}/{n}")]


async def test_cgroup_limits_cannot_be_raised_from_inside(tag: str) -> None:
    async with arena(tag, resources=cwa.Resources(pids=32)) as a:
        box = a.session.backend._boxes[a.victim.sandbox_id]  # type: ignore[attr-defined]
        if box.cgroup is None:
            pytest.skip("no writable cgroup here: limits are rlimits, which a process can only lower")
        peer = a.session.backend._boxes[a.canary.sandbox_id].cgroup  # type: ignore[attr-defined]
        before = pids_max(box.cgroup.paths)
        assert before and all(int(v) <= 32 + 16 for v in before.values()), before  # 32 + the agent's overhead
        for target in control_files([*box.cgroup.paths, *peer.paths]):
            r = await a.victim.exec(f"echo max > {target} || echo 1 > {target}; echo rc=$?")
            assert r.stdout.strip().endswith("rc=1") or "rc=2" in r.stdout, (target, r)
        assert pids_max(box.cgroup.paths) == before
        r = await a.victim.exec("mkdir /sys/fs/cgroup/pids/escape 2>&1; echo rc=$?")
        assert "rc=0" not in r.stdout


async def test_kernel_settings_cannot_be_written_from_inside(tag: str) -> None:
    async with arena(tag) as a:
        for target in ("/proc/sys/kernel/hostname", "/proc/sys/vm/drop_caches", "/proc/sysrq-trigger"):
            r = await a.victim.exec(f"echo 1 > {target}; echo rc=$?")
            assert "rc=0" not in r.stdout, (target, r)
        r = await a.victim.exec("hostname evil 2>&1; echo rc=$?")
        assert "rc=0" not in r.stdout


async def test_filling_every_writable_place_stops_at_its_quota(tag: str) -> None:
    mib = 1 << 20
    res = cwa.Resources(tmp_mib=8, workspace_mib=8, memory_mib=512)
    async with arena(tag, resources=res) as a:
        with anyio.fail_after(HANG_GUARD_SECONDS):
            fill = "for d in /tmp /workspace /dev/shm; do (head -c 200000000 /dev/zero > $d/fill; echo $d $?) & done"
            r = await a.victim.exec(fill + "; wait", timeout_seconds=HANG_GUARD_SECONDS)
        assert not r.timed_out  # each write ended at its quota (ENOSPC), not at a deadline
        assert all(line.split()[1] != "0" for line in r.stdout.splitlines()), r.stdout  # each write failed
        sizes = await a.victim.exec("stat -c '%n %s' /tmp/fill /workspace/fill /dev/shm/fill")
        got = {name: int(size) for name, size in (line.split() for line in sizes.stdout.splitlines())}
        assert got["/tmp/fill"] <= 8 * mib and got["/workspace/fill"] <= 8 * mib
        assert got["/dev/shm/fill"] <= 64 * mib
        # Full: the file API says so, typed, and the sandbox still runs commands.
        with pytest.raises(cwa.SandboxFileError):
            await a.victim.write_file("/workspace/more.txt", b"x" * mib)
        assert (await a.victim.exec(["echo", "alive"])).stdout == "alive\n"
        await a.victim.exec("rm /tmp/fill /workspace/fill /dev/shm/fill")
        await a.victim.write_file("/workspace/more.txt", b"x" * mib)  # space is back
        assert (await a.canary.exec("df -k /workspace | tail -1")).returncode == 0


async def test_path_tricks_in_the_file_api(tag: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CWSA_DRIVER_TOKEN", "DRIVER-ENV-SECRET")
    async with arena(tag) as a:
        sb = a.victim
        await sb.exec(
            "cd /workspace && ln -s /etc/shadow shadow && ln -s loop1 loop2 && ln -s loop2 loop1 "
            "&& ln -s /dev/zero zero && ln -s /proc/self/environ environ && ln -s /etc etc "
            "&& head -c 2000000 /dev/zero > big"
        )
        with anyio.fail_after(HANG_GUARD_SECONDS):
            for path in ("/workspace/shadow", "/workspace/loop1", "/workspace/zero", "/etc/shadow"):
                with pytest.raises(cwa.SandboxFileError):
                    await sb.read_file(path)
            with pytest.raises(cwa.SandboxFileError):
                await sb.read_file("/workspace/big", max_bytes=1 << 20)  # larger than asked for: refused
            try:  # the agent's own environment, if it lets itself read it
                env = await sb.read_file("/workspace/environ")
            except cwa.SandboxFileError:
                env = b""
            assert b"DRIVER-ENV-SECRET" not in env and b"CWSA_DRIVER_TOKEN" not in env
            for path in ("/workspace/etc/passwd", "/workspace/shadow", "/workspace/loop1", "/workspace/../etc/x"):
                with pytest.raises(cwa.SandboxFileError):
                    await sb.write_file(path, b"root::0:0::/:/bin/sh\n")
        # ".." is resolved before anything is sent: it cannot climb out of the sandbox's root.
        await sb.write_file("/workspace/../../../../tmp/dots.txt", b"stays inside")
        assert (await sb.exec(["cat", "/tmp/dots.txt"])).stdout == "stays inside"


async def test_write_file_onto_a_fifo_is_a_typed_error_and_the_sandbox_keeps_working(tag: str) -> None:
    """A FIFO planted where the driver will write (the next solution file, say) must not freeze the agent."""
    async with arena(tag) as a:
        await a.victim.exec(["mkfifo", "/workspace/solution.py"])
        # Opened for writing, a FIFO blocks until a reader comes: none will, so only refusing it ends
        # the call before its (long) timeout, which the hang guard is shorter than.
        with anyio.fail_after(HANG_GUARD_SECONDS), pytest.raises(cwa.SandboxFileError):
            await a.victim.write_file("/workspace/solution.py", b"print('hi')", timeout_seconds=10 * HANG_GUARD_SECONDS)
        with anyio.fail_after(HANG_GUARD_SECONDS):
            assert (await a.victim.exec(["echo", "alive"], timeout_seconds=HANG_GUARD_SECONDS)).stdout == "alive\n"
            with pytest.raises(cwa.SandboxFileError):
                await a.victim.read_file("/workspace/solution.py")


async def test_write_file_cannot_be_redirected_into_the_agents_channel(tag: str) -> None:
    """A symlink planted at the path the driver writes next, pointing at the agent's own stdout: with the
    sandbox user owning the agent's pipes (``host_uid=None``; any non-root driver) the driver's bytes,
    e.g. a model's completion, would be written into the protocol stream."""
    async with arena(tag, backend_options={"host_uid": None}) as a:
        await a.victim.exec(["ln", "-s", "/proc/self/fd/1", "/workspace/solution.py"])
        completion = b"\x00\x00\x00\x07\x12\x00\x00\x00\x02{}"  # what a forged frame looks like
        with anyio.fail_after(HANG_GUARD_SECONDS), pytest.raises(cwa.SandboxFileError):
            await a.victim.write_file("/workspace/solution.py", completion)
        assert (await a.victim.exec(["echo", "alive"], timeout_seconds=HANG_GUARD_SECONDS)).stdout == "alive\n"
