"""File calls through the native spawner (``cwspawn --file``): no CPython fork, the same results.

Every test runs on both paths (``path``: the native helper, and ``CWSANDBOX_LOCAL_SPAWNER=python``, a
fork of PID 1 running ``agent/files.py``) and checks the same bytes and the same error messages. Which
helper ran is seen from inside: ``/proc/self/cmdline`` read by a file call is the helper's own.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator

import pytest

import cwsandbox_async as cwa
from cwsandbox_async.backends.local import _native

from .conftest import local_session, requires_isolation

pytestmark = requires_isolation

HAS_CC = any(shutil.which(cc) for cc in ("cc", "gcc", "clang"))


@pytest.fixture(params=["native", "python"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "native":
        if not HAS_CC:
            pytest.skip("no C compiler: no spawner to build")
        monkeypatch.delenv(_native.ENV, raising=False)
    else:
        monkeypatch.setenv(_native.ENV, "python")
    return str(request.param)


@pytest.fixture
async def sb(tag: str, path: str) -> AsyncIterator[cwa.Sandbox]:
    res = cwa.Resources(file_size_mib=1)
    async with local_session(tag, isolation="unshare", resources=res) as s, s.sandbox() as box:
        yield box


async def test_the_helper_is_the_native_one_on_the_native_path(sb: cwa.Sandbox, path: str) -> None:
    argv = (await sb.read_file("/proc/self/cmdline")).split(b"\0")
    if path == "native":
        assert argv[:3] == [_native.INSIDE.encode(), b"--file", b"r"]
    else:
        assert b"--file" not in argv  # a fork of PID 1: its command line is PID 1's


async def test_round_trip_with_parents_made_and_binary_bytes(sb: cwa.Sandbox) -> None:
    data = bytes(range(256)) * 1000 + b"\0tail"
    await sb.write_file("/workspace/a/b/c/data.bin", data)
    assert await sb.read_file("/workspace/a/b/c/data.bin") == data
    await sb.write_file("/workspace/a/b/c/data.bin", b"short")  # replaced, truncated
    assert await sb.read_file("/workspace/a/b/c/data.bin") == b"short"
    await sb.write_file("/workspace/empty", b"")
    assert await sb.read_file("/workspace/empty") == b""


async def message(call: object) -> str:
    with pytest.raises(cwa.SandboxFileError) as caught:
        await call  # type: ignore[misc]
    return caught.value.message


async def test_errors_say_the_same_on_both_paths(sb: cwa.Sandbox) -> None:
    assert (await sb.exec(["sh", "-c", "mkfifo /workspace/fifo && mkdir /workspace/dir && echo x > /workspace/f"])).ok
    await sb.exec(["ln", "-s", "/proc/self/fd/1", "/workspace/own"])
    await sb.write_file("/workspace/big", b"x" * 100)
    assert await message(sb.read_file("/workspace/missing")) == "/workspace/missing: No such file or directory"
    assert await message(sb.read_file("/workspace/dir")) == "/workspace/dir: is a directory"
    assert await message(sb.read_file("/workspace/fifo")) == "/workspace/fifo: not a regular file"
    assert await message(sb.read_file("/workspace/own")) == "/workspace/own: not a regular file"
    assert await message(sb.read_file("/workspace/big", max_bytes=10)) == "/workspace/big: 100 bytes is more than 10"
    assert await message(sb.read_file("/proc/self/status", max_bytes=10)) == "/proc/self/status: more than 10 bytes"
    assert await message(sb.write_file("/workspace/fifo", b"x")) == "/workspace/fifo: No such device or address"
    assert await message(sb.write_file("/workspace/own", b"x")) == "/workspace/own: not a regular file"
    assert await message(sb.write_file("/workspace/dir", b"x")) == "/workspace/dir: Is a directory"
    assert await message(sb.write_file("/workspace/f/x", b"x")) == "/workspace/f/x: File exists"
    assert await message(sb.write_file("/usr/cwsandbox-x", b"x")) == "/usr/cwsandbox-x: Read-only file system"
    over = await message(sb.write_file("/workspace/huge", b"x" * (2 << 20)))
    assert over == f"/workspace/huge: {2 << 20} bytes is over the file size limit"
    assert await sb.read_file("/workspace/f") == b"x\n"  # nothing above touched it
