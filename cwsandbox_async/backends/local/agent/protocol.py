"""The protocol between the driver and a sandbox's PID 1 (stdlib only; both sides import it).

The channel is an ``AF_UNIX`` ``SOCK_SEQPACKET`` socket: every message is one datagram, and the
file descriptors that belong to it travel in the same message (``SCM_RIGHTS``). **PID 1 never
receives a request's bytes**: argv, environment, working directory, Python source, stdin and file
contents go into memfds the driver creates and passes along; PID 1 forks, closes its copies, and
only the forked child reads them. What PID 1 reads and writes are fixed-size numbers.

Driver -> PID 1, ``ORDER`` (kind, mode, flags, request id, timeout s, CPU budget s):

- ``O_RUN`` with fds ``[request, stdout, stderr]`` (+ stdin when ``F_STDIN``): start one exec.
  ``mode`` is ``M_EXEC`` (argv), ``M_PYTHON`` (source run in the fork itself), ``M_READ`` or
  ``M_WRITE`` (a file operation: fds ``[request, result]``, both memfds; see ``child``).
  ``F_EXCLUSIVE``: every other process of the sandbox is killed first, nothing starts beside it.
  A timeout or budget of 0 means none.
- ``O_KILL``: kill that exec's process tree (the driver gave up on it, or its output hit the cap).
- ``O_LISTEN`` with one fd, a listening ``SOCK_SEQPACKET`` socket (bound by the driver in its 0700
  state directory, where no process of the sandbox can reach it): PID 1 accepts connections on it,
  each a channel of its own (attach, ``_attach``), sends it ``HELLO`` and serves its orders; reports
  go to the channel an order came from. Only on the first channel, once. A connection from a process
  of the sandbox's own pid namespace is refused (its peer pid is not 0). PID 1 exits when its last
  channel closes.

The request memfd holds ``pack_request(cwd, argv, env, raw)`` for a command (``raw`` empty) or
Python (``argv`` empty, ``raw`` the source): NUL-separated fields, which the child splits with one
call (it runs between fork and execve, where every page it touches is a copy; NUL cannot occur in
argv, env or cwd). A file operation's holds ``pack_file_request(max bytes, path, shown path, data)``:
three NUL-terminated fields, then a write's data (the native spawner parses it too, ``spawn.c``).

PID 1 -> driver:

- ``HELLO``: ``bytes([R_HELLO]) + JSON`` (``pid``, ``python``, ``hardening``, ``cpus``, and for a
  born sandbox ``stamps``: ``time.monotonic()`` at the end of each step of its birth), once, when
  PID 1 is ready, before it reads any order.
- ``REPORT`` (kind, note, flags, request id, return code, wall s, CPU s, run-queue wait s, sandbox
  CPU s; a negative wait or sandbox CPU means unknown), once per order, when the exec's whole
  process tree is gone: ``R_DONE``, or ``R_FAIL`` when it could not run at all (``note`` says why).
  ``flags``: ``D_TIMED_OUT``, ``D_CPU_EXCEEDED``, ``D_OOM``. ``note``: why PID 1 itself ended it
  (``NOTES`` has the text the driver appends to its stderr).
"""

from __future__ import annotations

import array
import socket
import struct

ORDER = struct.Struct("=BBBxIdd")
REPORT = struct.Struct("=BBBxIidddd")
#: Most file descriptors one order carries.
MAX_ORDER_FDS = 4
#: Largest birth configuration message a newborn accepts (two messages on its channel, each about
#: a KiB in practice).
MAX_BIRTH_CONFIG = 1 << 14

O_RUN = 1
O_KILL = 2
O_LISTEN = 3

#: The driver's request id in PID 1's exec ids (which carry their channel's number above it).
RID_MASK = 0xFFFFFFFF

M_EXEC = 0
M_PYTHON = 1
M_READ = 2
M_WRITE = 3

F_EXCLUSIVE = 1
F_STDIN = 2

R_DONE = 1
R_FAIL = 2
R_HELLO = 3

D_TIMED_OUT = 1
D_CPU_EXCEEDED = 2
D_OOM = 4

N_NONE = 0
N_EXCLUSIVE = 1
N_NO_PROCESS = 2
N_STOPPED = 3
N_NOT_CLEAR = 4
N_BAD_ORDER = 5
#: What each note means, as the driver writes it on the exec's stderr (``cwsandbox: <text>``).
NOTES = {
    N_EXCLUSIVE: "killed: an exclusive exec started in this sandbox",
    N_NO_PROCESS: "cannot start the command: no process available (pids limit?)",
    N_STOPPED: "killed: a process in the sandbox stopped the file operation",
    N_NOT_CLEAR: "an exclusive exec could not stop the sandbox's other processes in time",
    N_BAD_ORDER: "malformed order",
}

#: Exit code of a command that could not be started (not executable, no such directory, no process).
SPAWN_FAILED = 126
#: Exit code of a command that was not found.
NOT_FOUND = 127


def pack_request(cwd: bytes, argv: list[bytes], env: list[tuple[bytes, bytes]], raw: bytes = b"") -> bytes:
    """A command's or a program's request (see the module docstring); ``raw`` may hold NUL."""
    head = b"%d %d" % (len(argv), len(env))
    return b"\0".join([head, cwd, *argv, *(x for pair in env for x in pair), raw])


def unpack_request(data: bytes) -> tuple[bytes, list[bytes], dict[bytes, bytes], bytes]:
    """(cwd, argv, env, raw) of ``pack_request``'s bytes; ``ValueError`` if malformed."""
    head, rest = data.split(b"\0", 1)
    argc, envc = (int(x) for x in head.split())
    parts = rest.split(b"\0", 1 + argc + 2 * envc)
    if len(parts) != 2 + argc + 2 * envc:
        raise ValueError("request shorter than its counts say")
    flat = parts[1 + argc : 1 + argc + 2 * envc]
    return parts[0], parts[1 : 1 + argc], dict(zip(flat[0::2], flat[1::2], strict=True)), parts[-1]


#: The longest head ``read_file_request`` reads: a number and two paths (``PATH_MAX`` each).
FILE_HEAD_MAX = 8300


def pack_file_request(max_bytes: int, path: bytes, shown: bytes, data: bytes = b"") -> bytes:
    """A file operation's request (see the module docstring); paths hold no NUL (validated above)."""
    return b"%d\0%s\0%s\0" % (max_bytes, path, shown) + data


def read_file_request(fd: int) -> tuple[int, bytes, bytes, int]:
    """(max bytes, path, shown path, where the data begins) of the memfd ``fd`` (``ValueError`` if malformed)."""
    import os

    head = os.pread(fd, FILE_HEAD_MAX, 0)
    parts = head.split(b"\0", 3)
    if len(parts) != 4:
        raise ValueError("malformed file request")
    return int(parts[0]), parts[1], parts[2], len(parts[0]) + len(parts[1]) + len(parts[2]) + 3


def received_fds(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    """The descriptors an ``SCM_RIGHTS`` message carried (``socket.recvmsg``'s ancillary data)."""
    out: list[int] = []
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            out.extend(array.array("i", data[: len(data) - len(data) % 4]))
    return out
