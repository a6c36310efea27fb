"""The sandbox agent: the first process inside a local sandbox (stdlib only).

It is not imported by the client: ``agent_source()`` concatenates ``_protocol``,
``_worker`` and this file, and the backend runs that program inside bubblewrap
with a tiny bootstrap (``python3 -I -c BOOTSTRAP``, see ``_backend``) that reads
the source and its JSON configuration from stdin before the protocol starts.

The agent speaks the framed protocol of ``_protocol`` on its stdin and stdout and
serves many requests at once from one ``epoll`` loop. It runs no command itself:
each exec goes to an idle *worker* (``_worker``), a fork of the agent reused from
exec to exec (forked when none is idle, at most ``MAX_IDLE_WORKERS`` kept idle; after
``idle_trim`` seconds without an exec, only one: each idle worker holds 1-1.5 MiB).
The agent creates the exec's stdout/stderr pipes and a memfd holding its stdin,
passes them to the worker, forwards output chunks to the client as they arrive,
and cuts a stream at the output cap (then orders the worker to kill the
command). The worker enforces the timeout and reports the exit status.

The agent is PID 1 of the sandbox's PID namespace (bwrap ``--as-pid-1``): it
reaps everything, and any process re-parented to it -- possible only if a
command killed its own worker -- is SIGKILLed at once. It exits when its stdin
closes (the driver went away), on ``EXIT``, or at the sandbox's max lifetime; as
PID 1 its exit kills the whole namespace.
"""

# ruff: noqa: SIM105
# (try/except/pass instead of contextlib.suppress: the agent imports as little as it can)

from __future__ import annotations  # removed from the sandbox copy: _protocol's, at the top, applies

try:  # in the package; inside the sandbox the source of these modules is prepended
    from ._agentfs import FileOpError, map_path, read_file, write_file
    from ._nsroot import enter_unshared_root
    from ._protocol import (
        HEADER,
        MAX_PAYLOAD,
        R_DATA,
        R_DONE,
        R_ERR,
        R_FAIL,
        R_HELLO,
        R_OK,
        R_OUT,
        T_EXEC,
        T_EXIT,
        T_KILL,
        T_PING,
        T_PY,
        T_READ,
        T_WRITE,
        pack_meta,
        unpack_meta,
    )
    from ._worker import (
        PR_SET_CHILD_SUBREAPER,
        PR_SET_DUMPABLE,
        PR_SET_PDEATHSIG,
        SPAWN_FAILED,
        W_KILL,
        W_RUN,
        WREQ,
        Worker,
        children_of,
        exit_status,
        kill_quietly,
        prctl,
        write_all,
    )
except ImportError:  # pragma: no cover - running as the agent
    pass

import array
import json
import os
import resource
import selectors
import signal
import socket
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import FrameType
    from typing import Any

CHUNK = 65536
#: Seconds past an exec's timeout after which the agent kills its worker itself (the worker
#: enforces the timeout; a command may have stopped it), reporting the exec as timed out.
BACKSTOP_SECONDS = 1.0
#: Seconds the agent waits for an exec's pipes to close after its worker reported.
EOF_GRACE_SECONDS = 1.0
MAX_IDLE_WORKERS = 8
#: Seconds without an exec after which idle workers beyond one are retired (config ``idle_trim``).
IDLE_TRIM_SECONDS = 5.0


class Exec:
    __slots__ = (
        "backstopped",
        "deadline",
        "eof_deadline",
        "err",
        "limit",
        "out",
        "rid",
        "sent",
        "start",
        "status",
        "truncated",
    )

    def __init__(self, rid: int, out: int, err: int, limit: int, timeout: float) -> None:
        self.rid = rid
        self.out = out
        self.err = err
        self.limit = limit
        self.start = time.monotonic()
        self.deadline = self.start + timeout + BACKSTOP_SECONDS
        self.eof_deadline: float | None = None
        self.status: tuple[int, float, bool] | None = None
        self.sent = [0, 0]
        self.truncated = False
        self.backstopped = False


class WorkerHandle:
    """The agent's side of one worker."""

    __slots__ = ("buf", "busy", "pid", "sock")

    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid = pid
        self.sock = sock
        self.buf = b""
        self.busy: Exec | None = None

    def kill_order(self, rid: int) -> None:
        try:
            self.sock.sendall(WREQ.pack(W_KILL, rid, 0))
        except OSError:
            pass


class Agent:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.env = dict(config.get("env") or {})
        self.limits = dict(config.get("limits") or {})
        self.file_limit = config.get("file_limit")
        self.path_map = [tuple(p) for p in config.get("path_map") or ()]
        self.oom_adjust = bool(config.get("oom_adjust", True))
        self.max_fd = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if self.max_fd <= 0 or self.max_fd > 1 << 20:
            self.max_fd = 1 << 16
        self.sel = selectors.EpollSelector()
        self.execs: dict[int, Exec] = {}
        self.workers: dict[int, WorkerHandle] = {}  # by pid
        self.by_exec: dict[int, WorkerHandle] = {}  # by request id
        self.idle: list[WorkerHandle] = []
        self.inbuf = bytearray()
        self.devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        self.wake_r, self.wake_w = os.pipe()
        self.running = True
        self.refill_after = 0.0
        self.idle_trim = float(config.get("idle_trim") or IDLE_TRIM_SECONDS)
        self.last_exec = time.monotonic()  # when the last exec started or ended
        ttl = config.get("ttl")
        self.ttl_deadline = time.monotonic() + float(ttl) if ttl else None

    # -- setup -------------------------------------------------------------------
    def setup(self) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGCHLD, _noop)
        os.set_blocking(self.wake_w, False)
        os.set_blocking(self.wake_r, False)
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        # Not dumpable (workers inherit it; commands, being exec'd, do not): commands run as the same
        # user but cannot ptrace the agent or a worker, read their memory or open /proc/1/fd/1.
        prctl(PR_SET_DUMPABLE, 0)
        subreaper = prctl(PR_SET_CHILD_SUBREAPER, 1)
        if self.config.get("die_with_parent"):
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        os.set_blocking(0, False)
        self.sel.register(0, selectors.EVENT_READ, "in")
        self.sel.register(self.wake_r, selectors.EVENT_READ, "sig")
        for name in self.config.get("preload") or ():
            try:
                __import__(name)
            except Exception:  # a module missing from this image is simply not preloaded
                continue
        spare = self.spawn_worker()
        if spare is not None:
            self.idle.append(spare)
        hello = {"pid": os.getpid(), "python": sys.version.split()[0], "subreaper": subreaper}
        self.send(0, R_HELLO, pack_meta(hello))

    def spawn_worker(self) -> WorkerHandle | None:
        try:
            mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError:
            return None
        try:
            pid = os.fork()
        except OSError:
            mine.close()
            theirs.close()
            return None
        if pid == 0:
            code = 0
            try:
                mine.close()
                Worker(theirs, self.limits, self.oom_adjust).serve(self.max_fd)
            finally:
                os._exit(code)
        theirs.close()
        handle = WorkerHandle(pid, mine)
        self.workers[pid] = handle
        self.sel.register(mine, selectors.EVENT_READ, handle)
        return handle

    def retire(self, handle: WorkerHandle) -> None:
        """Close a worker's socket: an idle worker exits when it reads the end."""
        if handle in self.idle:
            self.idle.remove(handle)
        try:
            self.sel.unregister(handle.sock)
        except (KeyError, ValueError):
            pass
        handle.sock.close()

    # -- I/O -----------------------------------------------------------------------
    def send(self, rid: int, ftype: int, payload: bytes = b"") -> None:
        header = HEADER.pack(rid, ftype, len(payload))
        if len(payload) < 4096:
            write_all(1, header + payload)
            return
        write_all(1, header)
        write_all(1, payload)

    def fail(self, rid: int, kind: str, message: str) -> None:
        self.send(rid, R_FAIL, pack_meta({"k": kind, "m": message}))

    def serve(self) -> None:
        self.setup()
        while self.running:
            events = self.sel.select(self.next_timeout())
            for key, _ in events:
                tag = key.data
                if tag == "in":
                    self.on_input()
                elif tag == "sig":
                    self.on_signal()
                elif isinstance(tag, WorkerHandle):
                    self.on_worker(tag)
                else:
                    self.on_output(tag[0], tag[1], key.fd)
                if not self.running:
                    break
            self.check_deadlines()
            if len(self.idle) > 1 and not self.execs and time.monotonic() >= self.last_exec + self.idle_trim:
                for handle in self.idle[1:]:  # keep the one idle longest (typically the least used)
                    self.retire(handle)
            if not events and not self.idle and self.running and time.monotonic() >= self.refill_after:
                spare = self.spawn_worker()  # refill while nothing else is waiting
                if spare is not None:
                    self.idle.append(spare)
                else:  # at the pids limit (a fork bomb?): try again later, do not spin
                    self.refill_after = time.monotonic() + 1.0
        self.shutdown()

    def next_timeout(self) -> float | None:
        deadlines: list[float] = [
            ex.eof_deadline if ex.eof_deadline is not None else ex.deadline for ex in self.execs.values()
        ]
        if self.ttl_deadline is not None:
            deadlines.append(self.ttl_deadline)
        if not self.idle:
            deadlines.append(max(time.monotonic() + 0.002, self.refill_after))
        elif len(self.idle) > 1 and not self.execs:
            deadlines.append(self.last_exec + self.idle_trim)
        if not deadlines:
            return None
        return max(0.0, min(min(deadlines) - time.monotonic(), 1.0))

    def on_input(self) -> None:
        try:
            data = os.read(0, 1 << 20)
        except BlockingIOError:
            return
        if not data:
            self.running = False
            return
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
        if ftype in (T_EXEC, T_PY):
            self.start_exec(rid, ftype, payload)
        elif ftype == T_KILL:
            handle = self.by_exec.get(rid)
            if handle is not None:
                handle.kill_order(rid)
        elif ftype == T_READ:
            self.read_file(rid, payload)
        elif ftype == T_WRITE:
            self.write_file(rid, payload)
        elif ftype == T_PING:
            self.send(rid, R_OK)
        elif ftype == T_EXIT:
            self.running = False
        else:
            self.fail(rid, "invalid", f"unknown frame type {ftype}")

    # -- exec ------------------------------------------------------------------------
    def start_exec(self, rid: int, ftype: int, payload: bytes) -> None:
        meta, raw = unpack_meta(payload)
        argv = meta.get("a")
        if ftype == T_EXEC and (not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv)):
            raise ValueError("argv must be a non-empty list of str")
        if rid in self.execs:
            raise ValueError(f"request id {rid} is already running")
        env = dict(self.env)
        env.update(meta.get("e") or {})
        timeout = float(meta.get("t") or 0)
        request = {"r": rid, "a": argv, "c": map_path(self.path_map, str(meta.get("c") or "/")), "e": env, "t": timeout}
        if ftype == T_PY:
            n = int(meta.get("n") or 0)
            stdin, source = raw[:n], raw[n:]
            request["py"] = True
        else:
            stdin, source = raw, b""
        self.last_exec = time.monotonic()
        handle = self.idle.pop() if self.idle else self.spawn_worker()
        if handle is None:
            self.send(rid, R_ERR, b"cwsandbox: cannot start the command: no process available (pids limit?)\n")
            self.send(rid, R_DONE, pack_meta({"rc": SPAWN_FAILED, "w": 0.0, "u": 0.0, "to": False, "tr": False}))
            return
        stdin_fd = self.devnull
        if stdin:
            stdin_fd = os.memfd_create("stdin", os.MFD_CLOEXEC)
            write_all(stdin_fd, stdin)
            os.lseek(stdin_fd, 0, os.SEEK_SET)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        encoded = json.dumps(request, separators=(",", ":")).encode()
        message = WREQ.pack(W_RUN, len(encoded), len(source)) + encoded + source
        try:
            sent = handle.sock.sendmsg(
                [message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, _fds(stdin_fd, out_w, err_w))]
            )
            if sent < len(message):
                handle.sock.sendall(message[sent:])
            ok = True
        except OSError:
            ok = False
        os.close(out_w)
        os.close(err_w)
        if stdin_fd != self.devnull:
            os.close(stdin_fd)
        ex = Exec(rid, out_r, err_r, int(meta.get("m") or 1 << 24), timeout)
        self.execs[rid] = ex
        os.set_blocking(out_r, False)
        os.set_blocking(err_r, False)
        self.sel.register(out_r, selectors.EVENT_READ, (ex, 0))
        self.sel.register(err_r, selectors.EVENT_READ, (ex, 1))
        if not ok:  # the worker died before taking the request
            self.retire(handle)
            ex.status = (SPAWN_FAILED, 0.0, False)
            ex.eof_deadline = time.monotonic() + EOF_GRACE_SECONDS
            return
        handle.busy = ex
        self.by_exec[rid] = handle

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
            handle = self.by_exec.get(ex.rid)
            if handle is not None:
                handle.kill_order(ex.rid)
        if data:
            ex.sent[which_stream] += len(data)
            self.send(ex.rid, R_OUT if which_stream == 0 else R_ERR, data)

    def close_stream(self, ex: Exec, which_stream: int) -> None:
        fd = ex.out if which_stream == 0 else ex.err
        if fd < 0:
            return
        self.sel.unregister(fd)
        os.close(fd)
        if which_stream == 0:
            ex.out = -1
        else:
            ex.err = -1
        self.maybe_finish(ex)

    def on_worker(self, handle: WorkerHandle) -> None:
        try:
            data = handle.sock.recv(4096)
        except OSError:
            data = b""
        if not data:
            self.worker_gone(handle, None)
            return
        lines = (handle.buf + data).split(b"\n")
        handle.buf = lines.pop()
        for line in lines:
            rid_s, rc_s, cpu_s, to_s = line.split()
            ex = self.execs.get(int(rid_s))
            if ex is not None and ex.status is None:
                ex.status = (int(rc_s), float(cpu_s), to_s == b"1")
                ex.eof_deadline = time.monotonic() + EOF_GRACE_SECONDS
                self.maybe_finish(ex)
            if handle.busy is not None and handle.busy.rid == int(rid_s):
                self.by_exec.pop(handle.busy.rid, None)
                handle.busy = None
                self.last_exec = time.monotonic()
                if len(self.idle) < MAX_IDLE_WORKERS:
                    self.idle.append(handle)
                else:
                    self.retire(handle)

    def worker_gone(self, handle: WorkerHandle, status: int | None) -> None:
        """A worker's socket closed or the worker was reaped: fail its exec if it had one."""
        if handle.sock.fileno() >= 0:
            self.retire(handle)
        ex = handle.busy
        handle.busy = None
        if ex is not None:
            self.by_exec.pop(ex.rid, None)
            if ex.status is None:
                rc = exit_status(status) if status is not None else -signal.SIGKILL
                ex.status = (rc if rc < 0 else -signal.SIGKILL, 0.0, ex.backstopped)
                ex.eof_deadline = time.monotonic() + EOF_GRACE_SECONDS
                self.maybe_finish(ex)

    def on_signal(self) -> None:
        try:
            while os.read(self.wake_r, 512):
                pass
        except BlockingIOError:
            pass
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            handle = self.workers.pop(pid, None)
            if handle is not None:
                self.worker_gone(handle, status)
        self.kill_orphans()

    def kill_orphans(self) -> None:
        """Anything re-parented to us that is not a worker escaped its exec: kill it."""
        for pid in children_of(os.getpid()):
            if pid not in self.workers:
                kill_quietly(pid, signal.SIGKILL)

    def check_deadlines(self) -> None:
        now = time.monotonic()
        if self.ttl_deadline is not None and now >= self.ttl_deadline:
            sys.stderr.write("cwsandbox agent: the sandbox reached its max lifetime\n")
            self.running = False
            return
        for ex in list(self.execs.values()):
            if ex.status is None and now >= ex.deadline:
                ex.backstopped = True
                handle = self.by_exec.get(ex.rid)
                if handle is not None:
                    kill_quietly(handle.pid, signal.SIGKILL)  # its command tree is then ours: kill_orphans
                ex.deadline = now + BACKSTOP_SECONDS
            elif ex.eof_deadline is not None and now >= ex.eof_deadline:
                for which_stream in (0, 1):
                    self.close_stream(ex, which_stream)

    def maybe_finish(self, ex: Exec) -> None:
        if ex.status is None or ex.out >= 0 or ex.err >= 0 or ex.rid not in self.execs:
            return
        del self.execs[ex.rid]
        rc, cpu, timed_out = ex.status
        done = {"rc": rc, "w": round(time.monotonic() - ex.start, 6), "u": cpu, "to": timed_out, "tr": ex.truncated}
        self.send(ex.rid, R_DONE, pack_meta(done))

    # -- files -------------------------------------------------------------------
    def read_file(self, rid: int, payload: bytes) -> None:
        meta, _ = unpack_meta(payload)
        shown = str(meta["p"])
        try:
            data = read_file(map_path(self.path_map, shown), shown, int(meta["m"]))
        except FileOpError as exc:
            return self.fail(rid, "file", str(exc))
        self.send(rid, R_DATA, data)
        return None

    def write_file(self, rid: int, payload: bytes) -> None:
        meta, data = unpack_meta(payload)
        shown = str(meta["p"])
        try:
            write_file(map_path(self.path_map, shown), shown, data, self.file_limit)
        except FileOpError as exc:
            return self.fail(rid, "file", str(exc))
        self.send(rid, R_OK)
        return None

    # -- exit ----------------------------------------------------------------------
    def shutdown(self) -> None:
        """Close every worker (a busy one kills its command tree and exits), then kill what is left."""
        for handle in list(self.workers.values()):
            try:
                handle.sock.close()
            except OSError:
                pass
        deadline = time.monotonic() + 0.5
        while self.workers and time.monotonic() < deadline:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                time.sleep(0.005)
            self.workers.pop(pid, None)
        for pid in children_of(os.getpid()):
            kill_quietly(pid, signal.SIGKILL)
        os._exit(0)


def _fds(*fds: int) -> bytes:
    return array.array("i", fds).tobytes()


def _noop(signum: int, frame: FrameType | None) -> None:
    pass


def main(argv: list[str]) -> None:
    config = json.loads(argv[-1]) if len(argv) > 1 else {}
    if config.get("mounts") is not None:
        try:
            enter_unshared_root(config)
        except BaseException:
            import traceback

            traceback.print_exc()
            os._exit(71)
    agent = Agent(config)
    try:
        agent.serve()
    except BrokenPipeError:
        os._exit(0)
    except BaseException:
        import traceback

        traceback.print_exc()
        os._exit(70)


if __name__ == "__main__":
    main(sys.argv)
