"""Attach by id (``Session.attach``): a sandbox another process created, reached through its registry entry.

The creator is a real second process (``CREATOR``), driven over its stdin: it creates a sandbox, prints
the id, and on each line runs one step (``close``: close its session; ``exit``: leave without closing).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from guards import HANG_GUARD_SECONDS

import cwsandbox_async as cwa
from cwsandbox_async._errors import SandboxNotFoundError
from cwsandbox_async.backends.local._registry import Registry, pid_alive

from .conftest import exists, requires_isolation, wait_until

pytestmark = requires_isolation

CREATOR = r"""
import asyncio, json, os, sys
import cwsandbox_async as cwa

async def main(state_dir):
    session = cwa.Session(cwa.SandboxDefaults(env={"FROM_CREATOR": "yes"}, tags=("attach-test",)),
                          backend="local", backend_options={"state_dir": state_dir})
    await session.open()
    sb = await session.sandbox()
    await sb.write_file("/workspace/made-by-creator", b"creator")
    print(json.dumps({"sid": sb.sandbox_id}), flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = (await loop.run_in_executor(None, sys.stdin.readline)).strip()
        if line == "exec":
            r = await sb.exec(["cat", "/workspace/made-by-attacher"])
            print(json.dumps({"rc": r.returncode, "out": r.stdout}), flush=True)
        elif line == "close":
            await session.aclose()
            print(json.dumps({"closed": True}), flush=True)
        elif line in ("exit", ""):
            os._exit(0)

asyncio.run(main(sys.argv[1]))
"""


class Creator:
    """The creating process, driven line by line."""

    def __init__(self, state_dir: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CREATOR, state_dir], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.sid = str(self.reply()["sid"])

    def reply(self) -> dict[str, object]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, "the creator process ended"
        return dict(json.loads(line))

    def step(self, what: str) -> dict[str, object]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(what + "\n")
        self.proc.stdin.flush()
        return self.reply()

    def end(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if self.proc.poll() is None:
            self.proc.stdin.write("exit\n")
            self.proc.stdin.flush()
            self.proc.wait(HANG_GUARD_SECONDS)
        self.proc.stdin.close()
        self.proc.stdout.close()


@pytest.fixture
def state_dir(tmp_path: Path) -> str:
    path = tmp_path / "state"
    path.mkdir(mode=0o700)
    return str(path)


@pytest.fixture
def creator(state_dir: str) -> Iterator[Creator]:
    c = Creator(state_dir)
    try:
        yield c
    finally:
        c.end()


def session(state_dir: str, **options: object) -> cwa.Session:
    return cwa.Session(backend="local", backend_options={"state_dir": state_dir, **options})


def pid1_alive(state_dir: str, sid: str) -> bool:
    entry = Registry(state_dir).read(sid)
    return entry is not None and pid_alive(entry.get("pid"), entry.get("pid_start"))


async def test_an_attached_handle_runs_commands_and_file_calls_as_the_creator_set_them(
    creator: Creator, state_dir: str
) -> None:
    async with session(state_dir) as s:
        sb = await s.attach(creator.sid)
        assert sb.tags == ("attach-test",)
        r = await sb.exec(["sh", "-c", 'cat /workspace/made-by-creator; echo " $FROM_CREATOR $PWD"'])
        assert (r.returncode, r.stdout) == (0, "creator yes /workspace\n")
        await sb.write_file("/workspace/made-by-attacher", b"attacher")
        assert creator.step("exec") == {"rc": 0, "out": "attacher"}  # the same sandbox, both channels live
        assert (await sb.run_python("print(6 * 7)")).stdout == "42\n"
    # Not adopted: the attacher's close let go of it, the creator still runs it.
    assert creator.step("exec") == {"rc": 0, "out": "attacher"}
    assert creator.step("close") == {"closed": True}
    assert not pid1_alive(state_dir, creator.sid)


async def test_the_creators_close_stops_a_sandbox_that_was_not_adopted(creator: Creator, state_dir: str) -> None:
    async with session(state_dir) as s:
        sb = await s.attach(creator.sid)
        creator.step("close")
        with pytest.raises(cwa.SandboxNotRunningError):
            await sb.exec(["true"])


async def test_adopting_moves_ownership_the_creators_close_leaves_it_running_the_adopters_stops_it(
    creator: Creator, state_dir: str
) -> None:
    registry = Registry(state_dir)
    async with session(state_dir) as s:
        sb = await s.attach(creator.sid, adopt=True)
        entry = registry.read(creator.sid)
        assert entry is not None and entry["owner_pid"] == os.getpid()
        assert s.backend.owns(creator.sid)
        assert creator.step("close") == {"closed": True}
        r = await sb.exec(["cat", "/workspace/made-by-creator"])
        assert (r.returncode, r.stdout) == (0, "creator")
        pid = entry["pid"]
    assert not pid1_alive(state_dir, creator.sid)
    assert registry.read(creator.sid) is None
    assert not exists(registry.socket_path(creator.sid))
    assert not exists(f"/proc/{pid}")


async def test_a_sandbox_dies_with_its_creators_process_and_the_attached_handle_says_so(
    creator: Creator, state_dir: str
) -> None:
    # Every sandbox lives in its creator's template's pid namespace, which dies with that process.
    async with session(state_dir) as s:
        sb = await s.attach(creator.sid)
        creator.proc.kill()
        creator.proc.wait(HANG_GUARD_SECONDS)
        await wait_until(lambda: not pid1_alive(state_dir, creator.sid))  # the kernel's kills take a moment
        with pytest.raises(cwa.SandboxNotRunningError):
            await sb.exec(["true"])


async def test_an_explicit_stop_stops_a_sandbox_that_was_not_adopted(creator: Creator, state_dir: str) -> None:
    async with session(state_dir) as s:
        sb = await s.attach(creator.sid)
        await sb.stop()
    assert not pid1_alive(state_dir, creator.sid)
    assert Registry(state_dir).read(creator.sid) is None


async def test_an_unknown_a_dead_or_another_users_id_is_not_found(
    creator: Creator, state_dir: str, tmp_path: Path
) -> None:
    other = tmp_path / "other-user"
    other.mkdir(mode=0o700)
    async with session(state_dir) as s:
        with pytest.raises(SandboxNotFoundError) as unknown:
            await s.attach("sbx-000000000000")
        assert unknown.value.infrastructure is False
    async with session(str(other)) as s:  # another user's registry: this one does not have it
        with pytest.raises(SandboxNotFoundError):
            await s.attach(creator.sid)
    creator.step("close")
    async with session(state_dir) as s:
        with pytest.raises(SandboxNotFoundError):
            await s.attach(creator.sid)


async def test_a_process_inside_the_sandbox_cannot_open_a_channel_to_its_pid1(tmp_path: Path) -> None:
    # The state directory is bound into the sandbox on purpose here (``expose``), so a command reaches
    # the attach socket's path (as this user: ``host_uid=None``, so the 0700 directory lets it in); PID 1
    # still refuses it: its peer is a process of its own pid namespace.
    state = Path(tempfile.mkdtemp(dir=os.path.dirname(os.getcwd())))  # not /tmp: a sandbox has its own
    probe = (
        "import socket,sys\n"
        "s=socket.socket(socket.AF_UNIX,socket.SOCK_SEQPACKET)\n"
        "s.connect(sys.argv[1])\n"
        "s.settimeout(60)\n"
        "print(repr(s.recv(4096)[:1]))\n"
    )
    try:
        async with session(str(state), expose=[str(state)], host_uid=None) as s:
            sb = await s.sandbox()
            path = Registry(str(state)).socket_path(sb.sandbox_id)
            r = await sb.exec(["python3", "-c", probe, path])
            assert r.returncode == 0, r.stderr
            assert r.stdout == "b''\n"  # closed at once: no hello, no orders
    finally:
        shutil.rmtree(state)


def test_the_cli_runs_a_command_in_a_running_sandbox_by_id_and_leaves_it_running(
    creator: Creator, state_dir: str
) -> None:
    def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "cwsandbox_async", *argv],
            capture_output=True,
            text=True,
            timeout=HANG_GUARD_SECONDS,
            check=False,
        )

    opt = ["--backend-option", f"state_dir={state_dir}"]
    done = cli("exec", *opt, "--id", creator.sid, "--", "cat", "/workspace/made-by-creator")
    assert (done.returncode, done.stdout) == (0, "creator"), done.stderr
    assert pid1_alive(state_dir, creator.sid)
    missing = cli("exec", *opt, "--id", "sbx-000000000000", "--", "true")
    assert missing.returncode == 125 and "no sandbox sbx-000000000000" in missing.stderr  # EXIT_EXEC_ERROR
