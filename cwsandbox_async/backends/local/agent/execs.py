"""The agent's bookkeeping of execs and workers (stdlib only).

``Exec`` is one exec request from arrival to its ``DONE`` frame; ``WorkerHandle``
is the agent's side of one worker. How an exec's facts are decided here:

- **timed out**: the worker says so (it checks the deadline where the command
  ended), or the agent's backstop fired (the worker was stopped or stuck past the
  timeout plus ``backstop``), or the worker died after the deadline.
- **OOM-killed**: the commands' cgroup counted an OOM kill while the exec ran, and
  either the command itself died of a SIGKILL nobody in the sandbox machinery sent,
  or no other exec ran at any moment of its lifetime (then the victim was one of
  its processes: the OOM killer picks the largest of the processes with the highest
  ``oom_score_adj``, and workers give every command 1000). When execs overlap and the
  victim is not the command itself, none of them is marked: a kill that cannot be
  attributed is not reported as anyone's.
- **killed by the sandbox**: an exclusive exec killed it, or it stopped its own
  worker; it then ends with ``-SIGKILL`` and a ``cwsandbox:`` line on its stderr
  saying why.
"""

from __future__ import annotations

import os
import socket
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

#: Why the agent itself ended an exec (written to its stderr).
KILLED_BY_EXCLUSIVE = "killed: an exclusive exec started in this sandbox"
STOPPED_ITS_WORKER = "killed: the command stopped the process supervising it"


class Exec:
    """One exec request, from arrival to its DONE frame."""

    __slots__ = (
        "ack_deadline",
        "acked",
        "backstopped",
        "budget",
        "deadline",
        "eof_deadline",
        "err",
        "exclusive",
        "handle",
        "held",
        "limit",
        "note",
        "oom_before",
        "out",
        "overlapped",
        "py",
        "request",
        "rid",
        "sandbox_cpu",
        "sandbox_cpu_at",
        "sent",
        "start",
        "status",
        "stdin",
        "timeout",
        "truncated",
        "wait_until",
    )

    def __init__(self, rid: int, py: bool, meta: dict[str, Any], request: bytes, stdin: bytes) -> None:
        self.rid = rid
        self.py = py
        self.request = request  # the memfd contents: cwd, env, argv or source (pack_meta format)
        self.stdin = stdin
        self.timeout = float(meta.get("t") or 0)
        budget = meta.get("b")
        self.budget = float(budget) if budget else 0.0
        self.exclusive = bool(meta.get("x"))
        self.limit = int(meta.get("m") or 1 << 24)
        self.out = self.err = -1
        self.start = time.monotonic()
        self.deadline = float("inf")
        self.eof_deadline: float | None = None
        #: (return code, cpu s, worker flags, run-queue wait s or None), once known
        self.status: tuple[int, float, int, float | None] | None = None
        self.sent = [0, 0]
        self.truncated = False
        self.backstopped = False
        self.handle: WorkerHandle | None = None
        self.held: list[int] = []  # fds passed to the worker, closed once it acknowledged
        self.acked = False
        self.ack_deadline = float("inf")
        self.oom_before = 0
        #: CPU seconds of the whole sandbox while it ran (the reading at its start until it ended)
        self.sandbox_cpu: float | None = None
        #: when ``sandbox_cpu`` (the start reading) is due or was taken; None: no reading
        self.sandbox_cpu_at: float | None = None
        self.overlapped = False
        self.note = ""  # why the agent ended it, if it did
        self.wait_until: float | None = None  # exclusive: give up clearing the sandbox at this time

    @property
    def running(self) -> bool:
        """Handed to a worker and not reported yet."""
        return self.handle is not None and self.status is None

    def close_held(self) -> None:
        for fd in self.held:
            try:
                os.close(fd)
            except OSError:
                pass
        self.held = []


class WorkerHandle:
    """The agent's side of one worker (``pid`` is 0 until it said hello)."""

    __slots__ = ("buf", "busy", "dirty", "pid", "sock", "stopped")

    def __init__(self, sock: socket.socket) -> None:
        self.pid = 0
        self.sock = sock
        self.buf = b""
        self.busy: Exec | None = None
        #: it read a command's argv/environment itself: never give it Python source again
        self.dirty = False
        self.stopped = False

    def order(self, message: bytes, fds: list[int] | None = None) -> bool:
        """Send an order (with fds); False when the worker is gone."""
        try:
            if fds:
                self.sock.sendmsg([message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, _fds(fds))])
            else:
                self.sock.sendall(message)
        except OSError:
            return False
        return True


def _fds(fds: list[int]) -> bytes:
    import array

    return array.array("i", fds).tobytes()
