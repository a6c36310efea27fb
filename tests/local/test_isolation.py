"""What a program in a local sandbox cannot see or touch (each test would fail without its protection)."""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path

import pytest
from guards import HANG_GUARD_SECONDS

import cwsandbox_async as cwa

from .conftest import exists, home_dir, local_session, read_text, requires_isolation

pytestmark = requires_isolation

CONNECT = """
import socket, sys
s = socket.socket()
s.settimeout(3)
try:
    s.connect(("127.0.0.1", int(sys.argv[1])))
except OSError as e:
    print("blocked", type(e).__name__)
else:
    print("connected")
"""


@pytest.fixture
def listener() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    yield sock
    sock.close()


async def test_no_network_reaches_a_host_server(listener: socket.socket, tag: str, isolation: str) -> None:
    port = str(listener.getsockname()[1])
    async with local_session(tag, isolation) as s:
        sb = await s.sandbox()
        r = await sb.exec(["python3", "-c", CONNECT, port], timeout_seconds=HANG_GUARD_SECONDS)
        assert r.stdout.startswith("blocked"), r
        r = await sb.exec(["cat", "/proc/net/dev"])
        interfaces = {line.split(":")[0].strip() for line in r.stdout.splitlines()[2:]}
        assert interfaces <= {"lo"}
        # The control: with network=True the same program does connect, so the check above can fail.
        sb_net = await s.sandbox(network=True)
        r = await sb_net.exec(["python3", "-c", CONNECT, port], timeout_seconds=HANG_GUARD_SECONDS)
        assert r.stdout.strip() == "connected", r


async def test_driver_secrets_are_invisible(monkeypatch: pytest.MonkeyPatch, tag: str, isolation: str) -> None:
    home = Path(home_dir())
    secret = home / f".cwsa-test-secret-{uuid.uuid4().hex[:8]}"
    secret.write_text("TOP-SECRET-FILE")
    monkeypatch.setenv("CWSA_TEST_SECRET", "TOP-SECRET-ENV")
    try:
        async with local_session(tag, isolation) as s:
            sb = await s.sandbox()
            r = await sb.exec(["cat", str(secret)])
            assert r.returncode != 0 and "TOP-SECRET" not in r.stdout
            r = await sb.exec(["ls", "-a", str(home)])
            assert secret.name not in r.stdout
            with pytest.raises(cwa.SandboxFileError):
                await sb.read_file(str(secret))
            r = await sb.exec("env; cat /proc/*/environ | tr '\\0' '\\n'")
            assert "TOP-SECRET-ENV" not in r.stdout and "CWSA_TEST_SECRET" not in r.stdout
            assert "PATH=" in r.stdout
            r = await sb.exec("ls /proc | grep -c '^[0-9]'")
            assert int(r.stdout) < 10  # its own pid namespace: no host processes
    finally:
        secret.unlink()


async def test_credential_places_are_masked(tag: str, isolation: str) -> None:
    async with local_session(tag, isolation) as s:
        sb = await s.sandbox()
        r = await sb.exec("ls -d /root /home /run /mnt /var/run/docker.sock 2>&1; cat /etc/shadow 2>&1 | head -1")
        assert "No such file" in r.stdout
        assert "root:" not in r.stdout
        r = await sb.exec(["id", "-u"])
        assert r.stdout.strip() == "1000"
        r = await sb.exec("grep -E '^(CapEff|NoNewPrivs)' /proc/self/status")
        assert "CapEff:\t0000000000000000" in r.stdout and "NoNewPrivs:\t1" in r.stdout
        if isolation == "bwrap":  # the unshare fallback does not block them (documented)
            r = await sb.exec(["unshare", "--user", "true"])
            assert r.returncode != 0  # no nested user namespaces


async def test_writes_outside_workspace_and_tmp_fail(tag: str, isolation: str) -> None:
    async with local_session(tag, isolation) as s:
        sb = await s.sandbox()
        for path in ("/usr/x", "/etc/x", "/x", "/var/x", "/dev/x", "/proc/x", "/sys/x"):
            r = await sb.exec(["touch", path])
            assert r.returncode != 0, path
            with pytest.raises(cwa.SandboxFileError):
                await sb.write_file(path, b"x")
        with pytest.raises(cwa.SandboxFileError):
            await sb.write_file("/etc/passwd", b"root::0:0::/:/bin/sh\n")
        for path in ("/workspace/ok", "/tmp/ok", "/dev/shm/ok"):
            r = await sb.exec(["touch", path])
            assert r.returncode == 0, (path, r.stderr)
        r = await sb.exec("echo hi > /dev/null && echo fine")
        assert r.stdout == "fine\n"


async def test_sandboxes_do_not_see_each_other(tag: str, isolation: str) -> None:
    async with local_session(tag, isolation) as s:
        a, b = await s.sandbox(), await s.sandbox()
        await a.write_file("/workspace/mine.txt", b"from a")
        await a.exec("echo a > /tmp/a-tmp")
        r = await b.exec("ls -A /workspace /tmp; cat /workspace/mine.txt")
        assert "mine.txt" not in r.stdout and "a-tmp" not in r.stdout and r.returncode != 0
        r = await b.exec("ls /proc | grep -c '^[0-9]'")
        assert int(r.stdout) < 10


async def test_path_tricks_stay_inside_the_sandbox_view(tag: str, isolation: str) -> None:
    home = Path(home_dir())
    secret = home / f".cwsa-test-link-{uuid.uuid4().hex[:8]}"
    secret.write_text("HOST-ONLY")
    try:
        async with local_session(tag, isolation) as s:
            sb = await s.sandbox()
            await sb.exec(["ln", "-s", str(secret), "/workspace/link"])
            with pytest.raises(cwa.SandboxFileError):
                await sb.read_file("/workspace/link")
            await sb.exec(["ln", "-s", "/etc", "/workspace/etc"])
            with pytest.raises(cwa.SandboxFileError):
                await sb.write_file("/workspace/etc/evil", b"x")  # resolves to the read-only /etc
            with pytest.raises(cwa.SandboxFileError):
                await sb.write_file("/workspace/../../etc/evil", b"x")
            assert not exists("/etc/evil")
    finally:
        secret.unlink()


async def test_tmp_and_workspace_are_size_limited(tag: str, isolation: str) -> None:
    if isolation == "plain":
        pytest.skip("the plain exec path has no size limit on /tmp and the workspace (documented)")
    async with local_session(tag, isolation, resources=cwa.Resources(tmp_mib=8, workspace_mib=8, memory_mib=256)) as s:
        sb = await s.sandbox()
        r = await sb.exec("dd if=/dev/zero of=/tmp/big bs=1M count=32 2>&1; ls -l /tmp/big")
        assert r.returncode != 0 or "No space" in r.stdout
        size = int((await sb.exec("stat -c %s /tmp/big")).stdout)
        assert size <= 8 * 1024 * 1024
        with pytest.raises(cwa.SandboxFileError):
            await sb.write_file("/workspace/big.bin", b"\0" * (9 * 1024 * 1024))


async def test_host_side_runs_unprivileged(tag: str, isolation: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("only meaningful when the driver is root")
    if isolation == "plain":
        pytest.skip("the plain exec path keeps no process between execs")
    async with local_session(tag, isolation) as s:
        sb = await s.sandbox()
        box = s.backend._boxes[sb.sandbox_id]  # type: ignore[attr-defined]
        status = read_text(f"/proc/{box.pid}/status")
        uid_line = next(line for line in status.splitlines() if line.startswith("Uid:"))
        assert uid_line.split()[1] != "0"
