"""The sandbox agent: the first process inside a local sandbox (stdlib only).

The agent speaks the framed protocol of ``protocol`` on the channel fds it was
given and serves many requests at once from one ``epoll`` loop. It runs no
command itself and never forks after it read a request:

- right after its start it forks the *template* (``template``), a clean
  interpreter that births workers on demand as the agent's own children;
- each exec goes to an idle *worker* (``worker``), reused from exec to exec (born
  when none is idle, at most ``max_idle_workers`` kept idle; after ``idle_trim``
  seconds without an exec, only one). ``run_python`` goes only to a worker that
  never read a request itself (``WorkerHandle.dirty``);
- the agent writes the request into a memfd, creates the exec's stdout/stderr
  pipes and a memfd holding its stdin, passes them to the worker, forwards output
  chunks to the client as they arrive, and cuts a stream at the output cap (then
  orders the worker to kill the command). The worker enforces the timeout and the
  CPU budget and reports the exit status; the agent decides the facts that need
  the whole sandbox's view (``execs``: OOM kills, exclusive execs).

Scheduling (``scheduler``; the processes: ``supervisor``) keeps requests in arrival order; an exclusive exec is a
barrier: the agent kills every other exec's processes, waits until they are gone,
runs it alone, and only then starts what arrived after it.

The agent is PID 1 of the sandbox's PID namespace: it reaps everything, and any
process re-parented to it -- possible only if a command killed its own worker --
is SIGKILLed at once. Every child is waited for with ``WUNTRACED``: a stopped
worker is killed and replaced (its exec, if any, ends as killed), a stopped
template is continued. It exits when its input closes (the driver went away), on
``EXIT``, or at the sandbox's max lifetime; as PID 1 its exit kills the whole
namespace.
"""

from __future__ import annotations

import os
import select
import selectors
import signal
import socket
import sys
import time

from . import files, proctree, protocol, scheduler
from .execs import Exec, WorkerHandle
from .protocol import HEADER, MAX_PAYLOAD, R_DATA, R_FAIL, R_HELLO, R_OK, pack_meta, unpack_meta

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import FrameType
    from typing import Any, NoReturn

    from .settings import Settings

CHUNK = 65536


class Agent(scheduler.Scheduler):
    def __init__(self, config: dict[str, Any], settings: Settings, rfd: int, wfd: int, boot: dict[str, Any]) -> None:
        super().__init__(config, settings, boot)
        self.rfd, self.wfd = rfd, wfd
        self.file_limit = config.get("file_limit")
        self.path_map = [tuple(p) for p in config.get("path_map") or ()]
        self.inbuf = bytearray()
        self.wake_r, self.wake_w = os.pipe()
        ttl = config.get("ttl")
        self.ttl_deadline = time.monotonic() + float(ttl) if ttl else None

    # -- setup -------------------------------------------------------------------
    def setup(self) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGCHLD, _noop)
        for fd in (self.wake_w, self.wake_r):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        os.set_blocking(self.rfd, False)
        self.sel.register(self.rfd, selectors.EVENT_READ, "in")
        self.sel.register(self.wake_r, selectors.EVENT_READ, "sig")
        self.start_machinery()
        hello = {
            "pid": os.getpid(),
            "python": sys.version.split()[0],
            "subreaper": self.subreaper,
            "template": self.template_pid,
            "workers": [h.pid for h in self.idle],
            "hardening": self.boot.get("hardening") or {},
        }
        self.send(0, R_HELLO, pack_meta(hello))

    # -- I/O -----------------------------------------------------------------------
    def send(self, rid: int, ftype: int, payload: bytes = b"") -> None:
        """Write one frame, waiting for room when the channel is full (it may be a non-blocking socket)."""
        header = HEADER.pack(rid, ftype, len(payload))
        if len(payload) < 4096:
            _write_fully(self.wfd, header + payload)
            return
        _write_fully(self.wfd, header)
        _write_fully(self.wfd, payload)

    def fail(self, rid: int, kind: str, message: str) -> None:
        self.send(rid, R_FAIL, pack_meta({"k": kind, "m": message}))

    def serve(self) -> NoReturn:
        self.setup()
        while self.running:
            events = self.sel.select(self.next_timeout())
            for key, _ in events:
                tag = key.data
                if tag == "in":
                    self.on_input()
                elif tag == "sig":
                    self.on_signal()
                elif tag == "template":
                    self.on_template()
                elif isinstance(tag, WorkerHandle):
                    self.on_worker(tag)
                else:
                    self.on_output(tag[0], tag[1], key.fd)
                if not self.running:
                    break
            if self.running:
                self.tick(not events)
        self.shutdown()

    def next_timeout(self) -> float | None:
        deadlines = self.deadlines()
        if self.ttl_deadline is not None:
            deadlines.append(self.ttl_deadline)
        if not deadlines:
            return None
        return max(0.0, min(min(deadlines) - time.monotonic(), 1.0))

    def on_input(self) -> None:
        try:
            data = os.read(self.rfd, 1 << 20)
        except BlockingIOError:
            return
        if not data:
            self.running = False
            return
        self.served = True  # from now on this process's memory holds request data: it never forks again
        buf = self.inbuf
        buf += data
        while len(buf) >= HEADER.size:
            rid, ftype, n = HEADER.unpack_from(buf)
            if n > MAX_PAYLOAD:
                sys.stderr.write(f"cwsandbox agent: frame of {n} bytes is too large\n")
                self.running = False
                return
            end = HEADER.size + n
            if len(buf) < end:
                break
            payload = bytes(buf[HEADER.size : end])
            del buf[:end]
            try:
                self.dispatch(rid, ftype, payload)
            except (ValueError, TypeError, KeyError) as exc:
                self.fail(rid, "invalid", f"bad request: {exc}")
            if not self.running:
                return

    def dispatch(self, rid: int, ftype: int, payload: bytes) -> None:
        if ftype in (protocol.T_EXEC, protocol.T_PY):
            self.submit(rid, ftype == protocol.T_PY, payload)
        elif ftype == protocol.T_KILL:
            self.cancel(rid)
        elif ftype == protocol.T_READ:
            self.read_file(rid, payload)
        elif ftype == protocol.T_WRITE:
            self.write_file(rid, payload)
        elif ftype == protocol.T_PING:
            self.send(rid, R_OK)
        elif ftype == protocol.T_EXIT:
            self.running = False
        else:
            self.fail(rid, "invalid", f"unknown frame type {ftype}")

    def on_output(self, ex: Exec, which_stream: int, fd: int) -> None:
        try:
            data = os.read(fd, CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.close_stream(ex, which_stream)
            return
        if ex.truncated:
            return
        room = ex.limit - ex.sent[which_stream]
        if len(data) > room:
            data = data[:room]
            ex.truncated = True
            self.cancel(ex.rid)
        if data:
            ex.sent[which_stream] += len(data)
            self.send(ex.rid, protocol.R_OUT if which_stream == 0 else protocol.R_ERR, data)

    def on_signal(self) -> None:
        try:
            while os.read(self.wake_r, 512):
                pass
        except BlockingIOError:
            pass
        self.reap()

    def tick(self, idle: bool) -> None:
        now = time.monotonic()
        if self.ttl_deadline is not None and now >= self.ttl_deadline:
            sys.stderr.write("cwsandbox agent: the sandbox reached its max lifetime\n")
            self.running = False
            return
        self.check_deadlines(now)
        self.maintain(idle, now)

    def map_cwd(self, cwd: str) -> str:
        return files.map_path(self.path_map, cwd)

    # -- files -------------------------------------------------------------------
    def read_file(self, rid: int, payload: bytes) -> None:
        meta, _ = unpack_meta(payload)
        shown = str(meta["p"])
        try:
            data = files.read_file(files.map_path(self.path_map, shown), shown, int(meta["m"]))
        except files.FileOpError as exc:
            return self.fail(rid, "file", str(exc))
        self.send(rid, R_DATA, data)
        return None

    def write_file(self, rid: int, payload: bytes) -> None:
        meta, data = unpack_meta(payload)
        shown = str(meta["p"])
        try:
            files.write_file(files.map_path(self.path_map, shown), shown, data, self.file_limit)
        except files.FileOpError as exc:
            return self.fail(rid, "file", str(exc))
        self.send(rid, R_OK)
        return None

    # -- exit ----------------------------------------------------------------------
    def shutdown(self) -> NoReturn:
        """Close every worker (a busy one kills its command tree and exits), then kill what is left."""
        self.close_machinery()
        deadline = time.monotonic() + self.settings.eof_grace / 2
        while self.children_left() and time.monotonic() < deadline:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                time.sleep(0.005)
        for pid in proctree.descendants(os.getpid()):
            proctree.kill_quietly(pid, signal.SIGKILL)
        os._exit(0)


def _noop(signum: int, frame: FrameType | None) -> None:
    pass


def _write_fully(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            select.select([], [fd], [])


def socketpair() -> tuple[socket.socket, socket.socket]:
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
