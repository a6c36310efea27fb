"""The agent's exec workers (stdlib only; part of the agent program, see ``_agent``).

A worker is a fork of the agent that runs one command at a time and is reused for
the next. At birth it starts a new session, becomes a *child subreaper*, asks to
die with the agent, raises its OOM score (so the OOM killer prefers commands over
the agent) and applies the sandbox's rlimits, which every command inherits.

Per exec, the agent sends a request on the worker's socket with the command's
stdin, stdout and stderr as passed file descriptors (SCM_RIGHTS). The worker
starts the command in its own process group (``posix_spawn``, or a fork of itself
-- a warm interpreter -- for Python source), then waits on a pidfd for it to exit,
on its socket for a kill order, and on the clock for the timeout. When the
command ends or is killed, the worker SIGKILLs its process group and then every
remaining descendant: orphans (double-forked or ``setsid`` daemons) are
re-parented to the worker, as a subreaper, so nothing started by an exec outlives
it. It reports ``"<rid> <returncode> <cpu seconds> <timed out>\\n"``, where the CPU
time is the whole tree's (``RUSAGE_CHILDREN`` before and after).

Messages agent -> worker: ``>BII`` = (1, json length, source length) + JSON +
source, with 3 fds (a request); (2, request id, 0) (kill that request). A closed
socket means exit.
"""

# ruff: noqa: SIM105
# (try/except/pass instead of contextlib.suppress: the agent imports as little as it can)

from __future__ import annotations  # removed from the sandbox copy: _protocol's, at the top, applies

import errno
import json
import os
import resource
import select
import signal
import socket
import struct
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn

WREQ = struct.Struct(">BII")
W_RUN = 1
W_KILL = 2
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
SPAWN_FAILED = 126
NOT_FOUND = 127
#: A worker retires after this many execs (bounds any slow growth of its own state).
MAX_EXECS_PER_WORKER = 5000
_SIGDEF = {
    signal.SIGPIPE,
    signal.SIGXFSZ,
    signal.SIGINT,
    signal.SIGQUIT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGALRM,
    signal.SIGCHLD,
}

_prctl: Any = None
try:
    import ctypes

    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except Exception:  # no ctypes in this image: orphans go to PID 1 (the agent), which kills them
    _prctl = None


def prctl(option: int, value: int) -> bool:
    """Call prctl(2); False when it is unavailable or fails."""
    if _prctl is None:
        return False
    return bool(_prctl(option, value, 0, 0, 0) == 0)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def children_of(pid: int) -> list[int]:
    """Direct children of ``pid`` (``/proc/PID/task/PID/children``, else a scan of /proc)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        pass
    kids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        fields = data[data.rfind(b")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            kids.append(int(name))
    return kids


def exit_status(status: int) -> int:
    """A wait status as a return code (negative: killed by that signal); also on Python < 3.9."""
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def kill_quietly(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass


def reap_descendants() -> None:
    """SIGKILL every child until none is left (orphans keep arriving: we are a subreaper)."""
    me = os.getpid()
    while True:
        for kid in children_of(me):
            kill_quietly(kid, signal.SIGKILL)
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def which(cmd: str, env: dict[str, str]) -> str | None:
    if "/" in cmd:
        return cmd
    for d in env.get("PATH", "/usr/local/bin:/usr/bin:/bin").split(":"):
        path = os.path.join(d or ".", cmd)
        if os.access(path, os.X_OK) and not os.path.isdir(path):
            return path
    return None


def apply_limits(limits: dict[str, int]) -> None:
    """The sandbox's rlimits, set on the worker and so inherited by every command."""
    table = (
        ("cpu", resource.RLIMIT_CPU, 1),
        ("fsize", resource.RLIMIT_FSIZE, 0),
        ("nproc", resource.RLIMIT_NPROC, 0),
        ("as", resource.RLIMIT_AS, 0),
    )
    for name, key, extra in table:
        value = limits.get(name)
        if value:
            try:
                resource.setrlimit(key, (value, value + extra))
            except (OSError, ValueError):
                pass


def exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        sys.stderr.write(f"{code}\n")
    except BaseException:  # a broken stderr at exit: the exit code stands
        pass
    return 1


def run_source(source: str, env: dict[str, str]) -> int:
    """In a fork of the worker: run Python source as ``python3 -c`` would; return the exit code."""
    import builtins
    import types

    for sig in (signal.SIGALRM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.clear()
    os.environ.update(env)
    sys.argv[:] = ["-c"]
    sys.path.insert(0, "")
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    rc = 0
    try:
        exec(compile(source, "<string>", "exec"), main.__dict__)
    except SystemExit as exc:
        rc = exit_code(exc.code)
    except BaseException:
        etype, value, tb = sys.exc_info()
        if etype is not None and value is not None:
            below = tb.tb_next if tb is not None else None  # hide this function's own frame
            sys.excepthook(etype, value.with_traceback(below), below)
        rc = 1
    try:
        threading = sys.modules.get("threading")
        if threading is not None:
            threading._shutdown()  # wait for non-daemon threads, as Python does
    except BaseException:  # a thread's failure does not change the exit code
        pass
    try:
        import atexit

        atexit._run_exitfuncs()
    except BaseException:  # exit handlers of user code may fail; the exit code stands
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # a closed or broken pipe at exit is not our error
            pass
    return rc


class Worker:
    """The worker process's side. ``serve`` never returns."""

    def __init__(self, sock: socket.socket, limits: dict[str, int], oom_adjust: bool) -> None:
        self.sock = sock
        self.limits = limits
        self.oom_adjust = oom_adjust
        self.buf = b""
        self.rid = 0
        self.child = 0
        self.killed = False

    def setup(self, max_fd: int) -> None:
        os.setsid()
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGUSR1, signal.SIGALRM):
            signal.signal(sig, signal.SIG_DFL)
        prctl(PR_SET_CHILD_SUBREAPER, 1)
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        keep = self.sock.fileno()
        os.closerange(3, keep)
        os.closerange(keep + 1, max_fd)
        if self.oom_adjust:
            try:
                with open("/proc/self/oom_score_adj", "w") as f:
                    f.write("1000")
            except OSError:
                pass
        apply_limits(self.limits)

    def serve(self, max_fd: int) -> NoReturn:
        try:
            self.setup(max_fd)
            for _ in range(MAX_EXECS_PER_WORKER):
                request = self.receive()
                if request is None:
                    break
                self.run(*request)
        except BrokenPipeError:
            pass
        finally:
            os._exit(0)

    # -- messages --------------------------------------------------------------
    def receive(self) -> tuple[dict[str, Any], bytes, list[int]] | None:
        """The next request (skipping stale kill orders), or None when the agent closed the socket."""
        fds: list[int] = []
        while True:
            if len(self.buf) < WREQ.size:
                data, anc, _, _ = self.sock.recvmsg(1 << 16, socket.CMSG_SPACE(16), socket.MSG_CMSG_CLOEXEC)
                for level, kind, payload in anc:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                        usable = len(payload) - len(payload) % 4
                        fds.extend(struct.unpack(f"{usable // 4}i", payload[:usable]))
                if not data:
                    return None
                self.buf += data
                continue
            kind, a, b = WREQ.unpack_from(self.buf)
            if kind == W_KILL:
                self.buf = self.buf[WREQ.size :]
                continue
            end = WREQ.size + a + b
            while len(self.buf) < end:
                data = self.sock.recv(max(end - len(self.buf), 1 << 16))
                if not data:
                    return None
                self.buf += data
            meta = json.loads(self.buf[WREQ.size : WREQ.size + a])
            source = self.buf[WREQ.size + a : end]
            self.buf = self.buf[end:]
            return meta, source, fds

    def on_message(self) -> bool:
        """Handle kill orders that arrived while a command runs; False when the agent went away."""
        data = self.sock.recv(4096)
        if not data:
            return False
        self.buf += data
        while len(self.buf) >= WREQ.size:
            kind, rid, _ = WREQ.unpack_from(self.buf)
            self.buf = self.buf[WREQ.size :]
            if kind == W_KILL and rid == self.rid:
                self.killed = True
                self.kill_group()
        return True

    def report(self, rc: int, cpu: float, timed_out: bool) -> None:
        self.sock.sendall(f"{self.rid} {rc} {cpu:.6f} {int(timed_out)}\n".encode())

    # -- one exec --------------------------------------------------------------
    def kill_group(self) -> None:
        if self.child:
            kill_quietly(-self.child, signal.SIGKILL)
            kill_quietly(self.child, signal.SIGKILL)

    def run(self, meta: dict[str, Any], source: bytes, fds: list[int]) -> None:
        self.rid = int(meta["r"])
        self.child = 0
        self.killed = False
        stdin_fd, out_w, err_w = fds[:3]
        env = meta["e"]
        try:
            os.chdir(meta["c"])
        except OSError as exc:
            return self.fail(SPAWN_FAILED, f"cannot change directory to {meta['c']!r}: {exc.strerror}", fds)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        try:
            if meta.get("py"):
                self.child = self.fork_python(source.decode("utf-8", "surrogateescape"), env, fds)
            else:
                argv = meta["a"]
                path = which(argv[0], env)
                if path is None:
                    raise FileNotFoundError(errno.ENOENT, "not found", argv[0])
                actions = [
                    (os.POSIX_SPAWN_DUP2, stdin_fd, 0),
                    (os.POSIX_SPAWN_DUP2, out_w, 1),
                    (os.POSIX_SPAWN_DUP2, err_w, 2),
                ]
                self.child = os.posix_spawn(
                    path, argv, env, file_actions=actions, setpgroup=0, setsigmask=(), setsigdef=_SIGDEF
                )
        except FileNotFoundError as exc:
            return self.fail(NOT_FOUND, f"{exc.filename or 'command'}: command not found", fds)
        except PermissionError as exc:
            return self.fail(SPAWN_FAILED, f"{exc.filename or 'command'}: permission denied", fds)
        except OSError as exc:
            return self.fail(SPAWN_FAILED, f"cannot start the command: {exc}", fds)
        for fd in fds:
            os.close(fd)
        timed_out = self.wait(float(meta.get("t") or 0))
        _, status, _ = os.wait4(self.child, 0)
        kill_quietly(-self.child, signal.SIGKILL)
        reap_descendants()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        self.report(exit_status(status), cpu, timed_out)
        return None

    def wait(self, timeout: float) -> bool:
        """Wait for the command to exit, killing it at the timeout; True if it timed out."""
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        try:
            pidfd = os.pidfd_open(self.child)
            poller.register(pidfd, select.POLLIN)
        except (AttributeError, OSError):
            pidfd = -1
        deadline = time.monotonic() + timeout if timeout > 0 else None
        timed_out = False
        try:
            while True:
                wait_ms = None
                if deadline is not None and not timed_out:
                    wait_ms = max(0, int((deadline - time.monotonic()) * 1000) + 1)
                if pidfd < 0:
                    wait_ms = 10 if wait_ms is None else min(wait_ms, 10)
                events = poller.poll(wait_ms)
                for fd, _ in events:
                    if fd == pidfd:
                        return timed_out
                    if not self.on_message():  # the agent is gone: nothing will read a report
                        self.kill_group()
                        reap_descendants()
                        os._exit(0)
                if deadline is not None and not timed_out and time.monotonic() >= deadline:
                    timed_out = True
                    self.kill_group()
                if pidfd < 0 and os.waitid(os.P_PID, self.child, os.WEXITED | os.WNOHANG | os.WNOWAIT):
                    return timed_out
        finally:
            if pidfd >= 0:
                os.close(pidfd)

    def fork_python(self, source: str, env: dict[str, str], fds: list[int]) -> int:
        pid = os.fork()
        if pid != 0:
            return pid
        code = 1
        try:
            os.setpgid(0, 0)
            prctl(PR_SET_DUMPABLE, 1)  # user code: an ordinary process again (the worker is not dumpable)
            for i, fd in enumerate(fds[:3]):
                os.dup2(fd, i)
            for fd in fds:
                os.close(fd)
            self.sock.close()
            code = run_source(source, env)
        finally:
            os._exit(code)

    def fail(self, rc: int, message: str, fds: list[int]) -> None:
        try:
            write_all(fds[2], f"cwsandbox: {message}\n".encode())
        except OSError:
            pass
        for fd in fds:
            os.close(fd)
        self.report(rc, 0.0, False)
