"""Kernel budgets the host charges per user or host-wide: one sandbox cannot take the driver's or a neighbour's.

The kernel charges some things to a user at every level of nested user namespaces, up to the driver's
uid on the host (pending signals and POSIX timers, POSIX message queue bytes, locked shared memory), some
to a host uid (descriptors in flight in Unix sockets), and others to one host-wide pool (AIO events, the
ptys of every devpts instance but the host's first). Each test has a sandbox take all it can, counted,
stopping a little past the bound (without the bound it stops there too: no test ever exhausts a real
budget of this host); then the driver and a neighbour sandbox take their own, and the counts the kernel
publishes are read on the host. Every test runs with a host uid per sandbox and with all sandboxes as
the driver's uid (as a non-root driver's are); an honest program's share of each budget still works.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import platform
import resource
import sys
from collections.abc import AsyncIterator

import anyio
import pytest
from guards import HANG_GUARD_SECONDS, LONG_SECONDS

import cwsandbox_async as cwa
from cwsandbox_async.backends.local.agent import _birth, harden, seccomp

from .conftest import local_session, requires_isolation

pytestmark = requires_isolation

COL = 0 if platform.machine() == "x86_64" else 1
IO_SETUP = seccomp.NOT_IMPLEMENTED["io_setup"][COL]
IO_DESTROY = (207, 1)[COL]
IO_URING_SETUP = seccomp.DENIED["io_uring_setup"][COL]
#: How far past a bound a hog tries before it stops on its own: enough to see a missing bound, far
#: from any real budget of this host.
PAST = 16

#: Takes units of one budget until refused or ``bound + PAST`` taken; prints "<taken> <errno name>" and
#: holds them (``HOLD`` seconds). ``TAKE`` is the one statement that takes a unit (raising OSError).
HOG = r"""
import array, ctypes, errno, os, signal, socket, sys, time
libc = ctypes.CDLL(None, use_errno=True)
kind, limit, hold = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
held = []
def check(rc):
    if rc < 0:
        raise OSError(ctypes.get_errno(), kind)
    return rc
def timer():
    tid = ctypes.c_void_p()
    check(libc.timer_create(1, None, ctypes.byref(tid)))  # CLOCK_MONOTONIC, SIGALRM, never armed
    held.append(tid)
def queued():
    check(libc.sigqueue(os.getpid(), signal.SIGRTMIN, ctypes.c_void_p(0)))
def aio():
    ctx = ctypes.c_ulong(0)
    check(libc.syscall(ctypes.c_long(int(sys.argv[4])), ctypes.c_long(1), ctypes.byref(ctx)))
    held.append(ctx)
def pty():
    held.append(os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY))
mq_attr = (ctypes.c_long * 4)(0, 8, 1024, 0)  # flags, 8 messages of 1 KiB, current
def mqueue():
    name = ctypes.c_char_p(f"/budget-{os.getpid()}-{len(held)}".encode())
    held.append(check(libc.mq_open(name, os.O_CREAT | os.O_RDWR, 0o600, ctypes.byref(mq_attr))))
def shm_lock():
    shmid = check(libc.shmget(0, ctypes.c_size_t(256 << 10), 0o1600))  # IPC_PRIVATE, IPC_CREAT | 0600
    held.append(shmid)
    check(libc.shmctl(shmid, 11, None))  # SHM_LOCK
def inflight():  # 253 descriptors (one message's most) into a socket's queue, never received
    if not held:
        held.extend(socket.socketpair())
        held[0].setblocking(False)
    held[0].sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [held[0].fileno()] * 253))])
kinds = {"timer": timer, "sigqueue": queued, "aio": aio, "pty": pty, "mqueue": mqueue, "shm_lock": shm_lock}
take = {**kinds, "inflight": inflight}[kind]
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGRTMIN})
taken, why = 0, "none"
while taken < limit:
    try:
        take()
    except OSError as exc:
        why = errno.errorcode.get(exc.errno, str(exc.errno))
        break
    taken += 1
print(taken, why, flush=True)
time.sleep(hold)
"""


@contextlib.asynccontextmanager
async def _hold(sb: cwa.Sandbox, kind: str, limit: int) -> AsyncIterator[tuple[int, str]]:
    """Run the hog for ``kind`` in ``sb``: (taken, why) while it holds them (killed on the way out)."""
    argv = ["python3", "-I", "-c", HOG, kind, str(limit), str(LONG_SECONDS), str(IO_SETUP)]
    async with sb.process(argv, timeout_seconds=LONG_SECONDS) as hog:
        line = b""
        with anyio.fail_after(HANG_GUARD_SECONDS):
            async for chunk in hog.stdout:
                line += chunk
                if line.endswith(b"\n"):
                    break
        taken, why = line.split()
        yield int(taken), why.decode()


async def _take(sb: cwa.Sandbox, kind: str, limit: int) -> tuple[int, str]:
    """What the hog for ``kind`` takes in ``sb`` (released when it ends)."""
    r = await sb.exec(
        ["python3", "-I", "-c", HOG, kind, str(limit), "0", str(IO_SETUP)], timeout_seconds=HANG_GUARD_SECONDS
    )
    assert r.returncode == 0, r
    taken, why = r.stdout.split()
    return int(taken), why


@pytest.fixture(params=["auto", None], ids=["own-uid", "driver-uid"])
def session(request: pytest.FixtureRequest, tag: str) -> cwa.Session:
    """A session whose sandboxes run as a host uid of their own each (as root, the default) or all as the
    driver's (``host_uid=None``: as a non-root driver's do, one uid of the template's namespace)."""
    return local_session(tag, backend_options={"host_uid": request.param})


def _pid1(session: cwa.Session, sb: cwa.Sandbox) -> int:
    pid = session.backend._boxes[sb.sandbox_id].pid  # type: ignore[attr-defined]
    assert isinstance(pid, int)
    return pid


def _sigq(pid: int | str) -> tuple[int, int]:
    """``SigQ`` of a process on the host: (signals queued to its user at its level, its limit)."""
    with open(f"/proc/{pid}/status") as f:
        line = next(line for line in f if line.startswith("SigQ:"))
    queued, limit = line.split()[1].split("/")
    return int(queued), int(limit)


def _driver_timers(n: int) -> int:
    """How many of ``n`` POSIX timers the driver could create (all deleted again)."""
    libc = ctypes.CDLL(None, use_errno=True)
    ids = []
    try:
        for _ in range(n):
            tid = ctypes.c_void_p()
            if libc.timer_create(1, None, ctypes.byref(tid)) != 0:
                break
            ids.append(tid)
        return len(ids)
    finally:
        for tid in ids:
            libc.timer_delete(tid)


@pytest.mark.parametrize("kind", ["timer", "sigqueue"])
async def test_a_sandbox_takes_at_most_its_own_pending_signals(session: cwa.Session, kind: str) -> None:
    """POSIX timers and queued signals are charged to the driver's user too; a sandbox holding all it
    may (its PID 1's ``SigQ``, read on the host, says ``64/64``) leaves the driver and a neighbour theirs."""
    bound = _birth.SIGPENDING
    async with session as s:
        victim, neighbour = await s.sandbox(), await s.sandbox()
        async with _hold(victim, kind, bound + PAST) as (taken, why):
            assert (taken, why) == (bound, "EAGAIN")
            assert _sigq(_pid1(s, victim)) == (bound, bound)  # the sandbox's whole count, and its limit
            assert _sigq("self")[0] >= taken  # charged to the driver's user as well: what the bound protects
            assert _driver_timers(bound) == bound
            assert await _take(neighbour, kind, bound + PAST) == (bound, "EAGAIN")


async def test_no_sandbox_takes_an_aio_context_from_the_hosts_pool(session: cwa.Session) -> None:
    """``io_setup`` is refused with ENOSYS (as on a kernel without AIO), ``io_uring_setup`` with EPERM:
    the host's ``fs.aio-nr`` stays the driver's, which can still set up a context."""
    async with session as s:
        sb = await s.sandbox()
        async with _hold(sb, "aio", PAST) as (taken, why):
            assert (taken, why) == (0, "ENOSYS")
            libc = ctypes.CDLL(None, use_errno=True)
            ctx = ctypes.c_ulong(0)
            assert libc.syscall(ctypes.c_long(IO_SETUP), ctypes.c_long(1), ctypes.byref(ctx)) == 0
            libc.syscall(ctypes.c_long(IO_DESTROY), ctx)
        probe = "import ctypes, sys; libc = ctypes.CDLL(None, use_errno=True); libc.syscall(int(sys.argv[1]), 1, 0); "
        probe += "print(ctypes.get_errno())"
        r = await sb.exec(["python3", "-I", "-c", probe, str(IO_URING_SETUP)], timeout_seconds=HANG_GUARD_SECONDS)
        assert int(r.stdout) == errno.EPERM


def _pty_count() -> int:
    with open("/proc/sys/kernel/pty/nr") as f:
        return int(f.read())


async def test_a_sandbox_opens_at_most_its_own_ptys(session: cwa.Session) -> None:
    """Every devpts instance but the host's first draws from one host-wide pool of ptys; a sandbox's
    own ``/dev/pts`` holds at most ``PTYS`` of them, and a neighbour still opens as many."""
    bound = _birth.PTYS
    async with session as s:
        victim, neighbour = await s.sandbox(), await s.sandbox()
        async with _hold(victim, "pty", bound + PAST) as (taken, why):
            assert (taken, why) == (bound, "ENOSPC")
            assert _pty_count() >= taken  # the host-wide count holds them
            assert await _take(neighbour, "pty", bound + PAST) == (bound, "ENOSPC")


async def test_a_sandbox_takes_at_most_its_own_message_queue_bytes(session: cwa.Session) -> None:
    """POSIX message queue bytes are charged to the driver's user too; ``RLIMIT_MSGQUEUE`` (64 KiB)
    bounds a sandbox's, and a neighbour gets as many queues while it holds them."""
    async with session as s:
        victim, neighbour = await s.sandbox(), await s.sandbox()
        per_queue = 8 * 1024  # the messages alone; the kernel adds its own bookkeeping
        most = harden.USER_RLIMITS["RLIMIT_MSGQUEUE"] // per_queue
        async with _hold(victim, "mqueue", most + PAST) as (taken, why):
            assert 0 < taken <= most and why == "EMFILE"  # what mq_open says past the limit
            assert await _take(neighbour, "mqueue", most + PAST) == (taken, why)


async def test_a_sandbox_locks_at_most_its_own_shared_memory(session: cwa.Session) -> None:
    """Shared memory locked with ``SHM_LOCK`` is charged to the driver's user too; ``RLIMIT_MEMLOCK``
    (1 MiB) bounds a sandbox's, and a neighbour locks as much while it holds it."""
    async with session as s:
        victim, neighbour = await s.sandbox(), await s.sandbox()
        most = harden.USER_RLIMITS["RLIMIT_MEMLOCK"] // (256 << 10)
        async with _hold(victim, "shm_lock", most + PAST) as (taken, why):
            assert (taken, why) == (most, "ENOMEM")
            assert await _take(neighbour, "shm_lock", most + PAST) == (most, "ENOMEM")


#: An honest program's share of each budget: a few timers (one armed and delivered), queued signals
#: received in order, a pty pair carrying a line, eventfd, timerfd, epoll, inotify, a message queue opened
#: without attributes carrying a message, and a locked page.
HONEST = r"""
import ctypes, mmap, os, select, signal
libc = ctypes.CDLL(None, use_errno=True)
class Sigevent(ctypes.Structure):
    _fields_ = [("value", ctypes.c_void_p), ("signo", ctypes.c_int), ("notify", ctypes.c_int), ("_", ctypes.c_long * 6)]
class Itimerspec(ctypes.Structure):
    _fields_ = [("interval", ctypes.c_long * 2), ("value", ctypes.c_long * 2)]
sig = signal.SIGRTMIN
signal.pthread_sigmask(signal.SIG_BLOCK, {sig, sig + 1})
ids = []
for i in range(8):
    tid = ctypes.c_void_p()
    ev = Sigevent(None, sig + 1, 0)  # SIGEV_SIGNAL
    assert libc.timer_create(1, ctypes.byref(ev), ctypes.byref(tid)) == 0, ctypes.get_errno()
    ids.append(tid)
spec = Itimerspec((0, 0), (0, 1000000))  # once, in 1 ms
assert libc.timer_settime(ids[0], 0, ctypes.byref(spec), None) == 0
assert signal.sigtimedwait({sig + 1}, 60).si_signo == sig + 1
for i in range(8):
    assert libc.sigqueue(os.getpid(), sig, ctypes.c_void_p(i)) == 0, ctypes.get_errno()
got = [signal.sigtimedwait({sig}, 60) for _ in range(8)]
assert all(g.si_signo == sig for g in got)
master, slave = os.openpty()
os.write(master, b"hello\n")
assert os.read(slave, 100).strip() == b"hello"
efd = os.eventfd(0)
os.eventfd_write(efd, 3)
assert os.eventfd_read(efd) == 3
tfd = libc.timerfd_create(1, 0)
assert tfd >= 0
ep = select.epoll()
ep.register(efd, select.EPOLLIN)
ep.register(tfd, select.EPOLLIN)
assert libc.inotify_init1(0) >= 0
mq = libc.mq_open(b"/honest", os.O_CREAT | os.O_RDWR, 0o600, None)  # the namespace's default queue
assert mq >= 0, ctypes.get_errno()
assert libc.mq_send(mq, b"hi", 2, 0) == 0, ctypes.get_errno()
buf = ctypes.create_string_buffer(8192)
assert libc.mq_receive(mq, buf, 8192, None) == 2, ctypes.get_errno()
page = mmap.mmap(-1, 4096)
buf = ctypes.c_char.from_buffer(page)
assert libc.mlock(ctypes.c_void_p(ctypes.addressof(buf)), ctypes.c_size_t(4096)) == 0, ctypes.get_errno()
del buf
print("ok")
"""


async def test_an_honest_program_keeps_its_share_of_every_budget(session: cwa.Session) -> None:
    async with session as s:
        sb = await s.sandbox()
        r = await sb.exec(["python3", "-I", "-c", HONEST], timeout_seconds=HANG_GUARD_SECONDS)
    assert (r.returncode, r.stdout) == (0, "ok\n"), r.stderr


#: Run on the host as the driver's uid with no capability in effect (as a non-root driver is): whether it
#: can still pass a file descriptor through a Unix socket.
PASS_FD = r"""
import array, ctypes, errno, socket
class Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
libc = ctypes.CDLL(None, use_errno=True)
assert libc.capset(ctypes.byref(Header(0x20080522, 0)), ctypes.byref((ctypes.c_uint32 * 6)())) == 0
a, b = socket.socketpair()
try:
    a.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [a.fileno()]))])
    print("sent")
except OSError as exc:
    print(errno.errorcode.get(exc.errno, exc.errno))
"""


async def test_a_sandbox_keeps_at_most_its_own_files_in_flight(session: cwa.Session) -> None:
    """Descriptors in flight in Unix sockets are counted per host uid and refused past the sender's file
    limit; a sandbox's limit is half the driver's, so holding all it may leaves the driver's uid (without
    the root's exemption, as a non-root driver runs) and a newborn sandbox able to pass theirs."""
    bound = _birth.files_bound(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    most = bound // 253 + 1  # sends are refused once the count is over the bound: one message may cross it
    async with session as s:
        victim = await s.sandbox()
        async with _hold(victim, "inflight", most + 2) as (taken, why):
            assert taken <= most and why == "ETOOMANYREFS", (taken, why)
            r = await anyio.run_process([sys.executable, "-I", "-c", PASS_FD], check=False)
            assert r.stdout.decode().strip() == "sent", r
            newborn = await s.sandbox()  # its PID 1 sends the driver a pidfd; each exec gets its pipes passed
            assert (await newborn.exec(["echo", "born"], timeout_seconds=HANG_GUARD_SECONDS)).stdout == "born\n"
