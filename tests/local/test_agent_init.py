"""The sandbox's PID 1 loop on its own, driven through its socket as the driver drives it (no sandbox).

The agent runs in a subprocess of the test (not as PID 1 of a namespace: a child subreaper), so a
command can stop it, which is what lets the deadline check at the command's end be seen.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from guards import HANG_GUARD_SECONDS

from cwsandbox_async.backends.local.agent import protocol as p
from cwsandbox_async.backends.local.agent.proctree import CLK_TCK

SERVE = """
import sys
from cwsandbox_async.backends.local.agent import init, settings
init.Init({}, settings.Settings(), int(sys.argv[1]), {"cpus": 1.0}).serve()
"""


#: The agent with every fork held 1.5 s before it happens: what a loaded kernel did to a sandbox's PID 1
#: (a fork blocked 6.1 s, a cgroup lock behind a slow RCU grace period), which no test can ask of it.
SLOW_FORK = (
    """
import os, time
real_fork = os.fork
def fork():
    time.sleep(1.5)
    return real_fork()
os.fork = fork
"""
    + SERVE
)


#: The agent not run for 1 s after each fork returns, while its child runs: what a busy machine does
#: to a PID 1 that lost its CPU at that moment.
LATE_PARENT = (
    """
import os, time
real_fork = os.fork
def fork():
    pid = real_fork()
    if pid:
        time.sleep(1.0)
    return pid
os.fork = fork
"""
    + SERVE
)


def start_agent(source: str) -> Iterator[socket.socket]:
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    proc = subprocess.Popen([sys.executable, "-c", source, str(theirs.fileno())], pass_fds=(theirs.fileno(),))
    theirs.close()
    mine.settimeout(30)
    try:
        hello = mine.recv(4096)
        assert hello[0] == p.R_HELLO and json.loads(hello[1:])["pid"] == proc.pid
        yield mine
    finally:
        mine.close()  # the agent kills what is left and exits
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def agent() -> Iterator[socket.socket]:
    yield from start_agent(SERVE)


@pytest.fixture
def slow_fork_agent() -> Iterator[socket.socket]:
    yield from start_agent(SLOW_FORK)


@pytest.fixture
def late_parent_agent() -> Iterator[socket.socket]:
    yield from start_agent(LATE_PARENT)


def send(sock: socket.socket, order: bytes, fds: list[int]) -> None:
    sock.sendmsg([order], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))] if fds else [])
    for fd in fds:
        os.close(fd)


def report(sock: socket.socket) -> tuple[int, ...]:
    data = sock.recv(4096)
    assert len(data) == p.REPORT.size, data
    return p.REPORT.unpack(data)


def command(argv: list[str]) -> int:
    """A request memfd for ``argv`` (what the driver writes)."""
    request = os.memfd_create("request")
    os.write(request, p.pack_request(b"/", [a.encode() for a in argv], [(b"PATH", b"/usr/bin:/bin")]))
    return request


def run(sock: socket.socket, argv: list[str], timeout: float, rid: int = 7) -> tuple[int, float, int, bytes]:
    """One exec order; (return code, wall seconds, flags, stdout) from its report."""
    request = command(argv)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    send(sock, p.ORDER.pack(p.O_RUN, p.M_EXEC, 0, rid, timeout, 0.0), [request, out_w, err_w])
    kind, _note, flags, got, rc, wall, *_ = report(sock)
    assert (kind, got) == (p.R_DONE, rid)
    with os.fdopen(out_r, "rb") as out:
        stdout = out.read()
    os.close(err_r)
    return rc, wall, flags, stdout


def test_a_command_that_ends_in_time_is_not_timed_out(agent: socket.socket) -> None:
    rc, wall, flags, out = run(agent, ["sh", "-c", "sleep 0.1; echo done"], timeout=5)
    assert (rc, flags & p.D_TIMED_OUT, out) == (0, 0, b"done\n") and wall < 5


def test_a_start_the_kernel_held_up_is_not_the_programs_time(slow_fork_agent: socket.socket) -> None:
    """The exec's clock starts once its process exists: a fork held 1.5 s leaves a 1 s timeout to a
    command that takes 0.2 s (before, it was killed at a deadline that passed before it existed)."""
    start = time.monotonic()
    rc, wall, flags, out = run(slow_fork_agent, ["sh", "-c", "sleep 0.2; echo done"], timeout=1)
    assert time.monotonic() - start >= 1.5  # the fork was held
    assert (rc, flags & p.D_TIMED_OUT, out) == (0, 0, b"done\n")
    assert 0.2 <= wall < 1.5


def test_a_command_that_ran_while_its_supervisor_waited_keeps_that_time_on_its_clock(
    late_parent_agent: socket.socket,
) -> None:
    """The exec's clock starts when its process was born, not when PID 1 next ran: a command that
    runs 1.2 s against a 0.5 s timeout is timed out even though PID 1 lost 1 s after its fork (before,
    the clock started then, and the command ended 0.2 s "after its start": in time)."""
    rc, wall, flags, _ = run(late_parent_agent, ["sh", "-c", "sleep 1.2; echo done"], timeout=0.5)
    assert flags & p.D_TIMED_OUT, (rc, wall, flags)
    assert wall >= 1.0 - 1 / CLK_TCK, wall


def test_the_deadline_is_checked_where_the_command_ends(agent: socket.socket) -> None:
    """The command stops its supervisor, exits at once, and has it continued past the deadline:
    the supervisor then finds an exited command, but the clock says the timeout passed."""
    script = "w=$PPID; (sleep 1.5; kill -CONT $w) & kill -STOP $w; exit 0"
    start = time.monotonic()
    rc, wall, flags, _ = run(agent, ["sh", "-c", script], timeout=0.5)
    assert time.monotonic() - start >= 1.5
    assert rc == 0 and wall >= 1.5 - 1 / CLK_TCK  # dated by the kernel's birth stamp if PID 1 was stopped first
    assert flags & p.D_TIMED_OUT, "an exec that ended past its timeout was reported in time"


def test_a_daemon_the_command_left_dies_with_its_exec(agent: socket.socket) -> None:
    mark = str(4000 + os.getpid() % 1000)
    rc, _, _, out = run(
        agent, ["sh", "-c", f"(setsid sleep {mark} > /dev/null 2>&1 &); echo left"], timeout=HANG_GUARD_SECONDS
    )
    assert (rc, out) == (0, b"left\n")
    ps = subprocess.run(["pgrep", "-f", f"sleep {mark}"], capture_output=True, check=False)
    assert ps.stdout == b"", "a daemon outlived its exec"


def test_a_bad_order_is_refused_and_the_agent_serves_on(agent: socket.socket) -> None:
    request = os.memfd_create("request")
    send(agent, p.ORDER.pack(p.O_RUN, p.M_EXEC, 0, 3, 5.0, 0.0), [request])  # no pipes
    kind, note, *_ = report(agent)
    assert (kind, note) == (p.R_FAIL, p.N_BAD_ORDER)
    agent.send(b"not an order")  # ignored
    assert run(agent, ["echo", "ok"], timeout=HANG_GUARD_SECONDS)[3] == b"ok\n"


def test_a_kill_order_ends_the_whole_tree(agent: socket.socket) -> None:
    request = command(["sh", "-c", "sleep 30 & sleep 30"])
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    send(agent, p.ORDER.pack(p.O_RUN, p.M_EXEC, 0, 9, 0.0, 0.0), [request, out_w, err_w])
    time.sleep(0.3)
    send(agent, p.ORDER.pack(p.O_KILL, 0, 0, 9, 0.0, 0.0), [])
    kind, _, flags, rid, rc, *_ = report(agent)
    # Killed (left alone, its sleeps would end with 0 after 30 s).
    assert (kind, rid, rc, flags & p.D_TIMED_OUT) == (p.R_DONE, 9, -signal.SIGKILL, 0)
    with os.fdopen(out_r, "rb") as out:
        assert out.read() == b""  # end of file: nothing holds the pipe any more
    os.close(err_r)
