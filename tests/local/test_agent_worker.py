"""An agent worker on its own, driven through its socket as the agent drives it (no sandbox needed).

The worker runs in a subprocess of the test, so the test is its parent: nothing else notices
when a command stops it, which is what lets the deadline check at the command's end be seen.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from cwsandbox_async.backends.local.agent import protocol, worker

SERVE = """
import socket, sys
from cwsandbox_async.backends.local.agent import settings, worker
sock = socket.socket(fileno=int(sys.argv[1]))
worker.Worker(sock, {}, settings.Settings(), 1.0).serve(worker.max_fd())
"""


@pytest.fixture
def worker_sock() -> Iterator[socket.socket]:
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    proc = subprocess.Popen([sys.executable, "-c", SERVE, str(theirs.fileno())], pass_fds=(theirs.fileno(),))
    theirs.close()
    mine.settimeout(30)
    try:
        kind, pid, *_ = worker.WREP.unpack(_recv(mine, worker.WREP.size))
        assert (kind, pid) == (worker.K_HELLO, proc.pid)
        yield mine
    finally:
        mine.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _recv(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "the worker closed its socket"
        data += chunk
    return data


def run(sock: socket.socket, argv: list[str], timeout: float) -> tuple[int, float, int]:
    """Send one exec order; (return code, wall seconds, flags) from its report."""
    request = os.memfd_create("request")
    os.write(request, protocol.pack_meta({"a": argv, "c": "/", "e": {"PATH": "/usr/bin:/bin"}}))
    os.lseek(request, 0, os.SEEK_SET)
    stdin = os.open(os.devnull, os.O_RDONLY)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    fds = [request, stdin, out_w, err_w]
    order = worker.WREQ.pack(worker.W_RUN, 7, timeout, 0.0, 0)
    sock.sendmsg([order], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))])
    for fd in (*fds, out_r, err_r):
        os.close(fd)
    kind, rid, *_ = worker.WREP.unpack(_recv(sock, worker.WREP.size))
    assert (kind, rid) == (worker.K_ACK, 7)
    kind, rid, rc, wall, _cpu, _wait, flags = worker.WREP.unpack(_recv(sock, worker.WREP.size))
    assert (kind, rid) == (worker.K_DONE, 7)
    return rc, wall, flags


def test_a_command_that_ends_in_time_is_not_timed_out(worker_sock: socket.socket) -> None:
    rc, wall, flags = run(worker_sock, ["sh", "-c", "sleep 0.1"], timeout=5)
    assert (rc, flags & worker.D_TIMED_OUT) == (0, 0) and wall < 5


def test_the_deadline_is_checked_where_the_command_ends(worker_sock: socket.socket) -> None:
    """The command stops its worker, exits at once, and has the worker continued past the deadline:
    the worker then sees an exited command but the clock says the timeout passed."""
    script = "w=$PPID; (sleep 1.5; kill -CONT $w) & kill -STOP $w; exit 0"
    start = time.monotonic()
    rc, wall, flags = run(worker_sock, ["sh", "-c", script], timeout=0.5)
    assert time.monotonic() - start >= 1.5
    assert rc == 0 and wall >= 1.5
    assert flags & worker.D_TIMED_OUT, "an exec that ended past its timeout was reported in time"
