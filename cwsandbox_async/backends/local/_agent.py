"""The sandbox agent: the first process inside a local sandbox (stdlib only).

It is not imported by the client; ``agent_source()`` returns ``_protocol.py``
followed by this file, which the backend runs as ``python3 -I -c SOURCE CONFIG``
inside bubblewrap. It speaks the framed protocol of ``_protocol`` on its stdin and
stdout and serves many requests at once from one ``epoll`` loop.

Each exec gets a *monitor*: a fork of the agent that starts a new session, becomes
a child subreaper, applies the per-exec rlimits, starts the command in its own
process group (``posix_spawn``, or a fork of the warm interpreter for Python
source) and waits for it. When the command ends, or at its timeout, or when the
client cancels it or its output passes the cap, the monitor SIGKILLs the
command's process group, then kills every remaining descendant: orphans of the
command (double-forked, ``setsid``-detached daemons) are re-parented to the
monitor because it is a subreaper, so nothing started by an exec outlives it. The
monitor then reports the exit status and the CPU time of the whole tree
(``RUSAGE_CHILDREN``) on a status pipe and exits.

The agent is PID 1 of the sandbox's PID namespace (bwrap ``--as-pid-1``): it
reaps everything, and any process re-parented to it (possible only if a
command killed its own monitor) is SIGKILLed at once. It exits when its stdin
closes (the driver went away) or on ``EXIT``; as PID 1 its exit kills the whole
namespace.
"""

# ruff: noqa: E402

try:  # in the package (tests import it); inside the sandbox _protocol's source is prepended
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
except ImportError:  # pragma: no cover - running as the agent
    pass

import errno
import json
import os
import resource
import selectors
import signal
import stat
import sys
import time

CHUNK = 65536
#: Seconds past an exec's timeout after which the agent kills its monitor itself.
BACKSTOP_SECONDS = 3.0
#: Seconds the agent waits for an exec's pipes to close after its monitor reported.
EOF_GRACE_SECONDS = 1.0
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
SPAWN_FAILED = 126
NOT_FOUND = 127
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

_prctl = None
try:
    import ctypes

    _libc = ctypes.CDLL(None, use_errno=True)
    _prctl = _libc.prctl
except Exception:  # pragma: no cover - no ctypes in this image: orphans go to PID 1, which kills them
    _prctl = None


def prctl(option, value):
    """Call prctl(2); False when it is unavailable or fails."""
    if _prctl is None:
        return False
    return _prctl(option, value, 0, 0, 0) == 0


def write_all(fd, data):
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def children_of(pid):
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


def kill_quietly(pid, sig):
    try:
        os.kill(pid, sig)
    except OSError:
        pass


def reap_descendants():
    """SIGKILL every child until none is left (orphans keep arriving: we are a subreaper)."""
    me = os.getpid()
    while True:
        for kid in children_of(me):
            kill_quietly(kid, signal.SIGKILL)
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return
        except InterruptedError:  # pragma: no cover - PEP 475 retries
            continue


def which(cmd, env):
    if "/" in cmd:
        return cmd
    for d in env.get("PATH", "/usr/local/bin:/usr/bin:/bin").split(":"):
        path = os.path.join(d or ".", cmd)
        if os.access(path, os.X_OK) and not os.path.isdir(path):
            return path
    return None


def set_limits(limits):
    """Per-exec rlimits (a monitor applies them to itself; the command inherits them)."""
    for name, key in (("cpu", resource.RLIMIT_CPU), ("fsize", resource.RLIMIT_FSIZE)):
        value = limits.get(name)
        if value:
            hard = value + 1 if name == "cpu" else value
            try:
                resource.setrlimit(key, (value, hard))
            except (OSError, ValueError):
                pass
    if limits.get("nproc"):
        try:
            resource.setrlimit(resource.RLIMIT_NPROC, (limits["nproc"], limits["nproc"]))
        except (OSError, ValueError):
            pass
    if limits.get("as"):
        try:
            resource.setrlimit(resource.RLIMIT_AS, (limits["as"], limits["as"]))
        except (OSError, ValueError):
            pass


class Monitor:
    """Runs in the forked monitor process; never returns (``os._exit``)."""

    def __init__(self, rid, status_fd, timeout):
        self.rid = rid
        self.status_fd = status_fd
        self.timeout = timeout
        self.child = 0
        self.timed_out = False
        self.killed = False

    def _kill_group(self):
        if self.child:
            kill_quietly(-self.child, signal.SIGKILL)
            kill_quietly(self.child, signal.SIGKILL)

    def on_alarm(self, signum, frame):
        self.timed_out = True
        self._kill_group()

    def on_cancel(self, signum, frame):
        self.killed = True
        self._kill_group()

    def report(self, rc):
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        line = f"{self.rid} {rc} {ru.ru_utime + ru.ru_stime:.6f} {int(self.timed_out)}\n"
        write_all(self.status_fd, line.encode())

    def fail(self, rc, message):
        try:
            write_all(2, f"cwsandbox: {message}\n".encode())
        except OSError:
            pass
        self.report(rc)
        os._exit(0)

    def run(self, agent, stdin_fd, out_w, err_w, cwd, limits, start):
        os.setsid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGALRM, self.on_alarm)
        signal.signal(signal.SIGUSR1, self.on_cancel)
        prctl(PR_SET_CHILD_SUBREAPER, 1)
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        os.dup2(stdin_fd, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.closerange(3, self.status_fd)
        os.closerange(self.status_fd + 1, agent.max_fd)
        if agent.oom_adjust:
            try:
                with open("/proc/self/oom_score_adj", "w") as f:
                    f.write("1000")
            except OSError:
                pass
        set_limits(limits)
        if self.timeout > 0:
            signal.setitimer(signal.ITIMER_REAL, self.timeout)
        try:
            os.chdir(cwd)
        except OSError as exc:
            self.fail(SPAWN_FAILED, f"cannot change directory to {cwd!r}: {exc.strerror}")
        try:
            self.child = start()
        except FileNotFoundError as exc:
            self.fail(NOT_FOUND, f"{exc.filename or 'command'}: command not found")
        except PermissionError as exc:
            self.fail(SPAWN_FAILED, f"{exc.filename or 'command'}: permission denied")
        except OSError as exc:
            self.fail(SPAWN_FAILED, f"cannot start the command: {exc}")
        if self.killed or self.timed_out:
            self._kill_group()
        for fd in (0, 1, 2):
            os.close(fd)
        _, status, _ = os.wait4(self.child, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
        rc = os.waitstatus_to_exitcode(status)
        kill_quietly(-self.child, signal.SIGKILL)
        reap_descendants()
        self.report(rc)
        os._exit(0)


def run_source(source, env, status_fd):
    """In the forked worker: run Python source as ``python3 -c`` would, return the exit code."""
    import builtins
    import types

    os.close(status_fd)
    os.setpgid(0, 0)
    for sig in (signal.SIGALRM, signal.SIGUSR1, signal.SIGCHLD, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.clear()
    os.environ.update(env)
    sys.argv[:] = ["-c"]
    sys.path.insert(0, "")
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    rc = 0
    try:
        exec(compile(source, "<string>", "exec"), main.__dict__)
    except SystemExit as exc:
        rc = exit_code(exc.code)
    except BaseException:
        etype, value, tb = sys.exc_info()
        sys.excepthook(etype, value, tb.tb_next if tb is not None else None)
        rc = 1
    try:
        import atexit

        atexit._run_exitfuncs()
    except BaseException:  # noqa: S110 - exit handlers of user code may fail; the exit code stands
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: S110 - a closed or broken pipe at exit is not our error
            pass
    return rc


def exit_code(code):
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        sys.stderr.write(f"{code}\n")
    except BaseException:  # noqa: S110
        pass
    return 1


class Exec:
    __slots__ = (
        "cancelled",
        "deadline",
        "err",
        "eof_deadline",
        "limit",
        "monitor",
        "out",
        "rid",
        "sent",
        "start",
        "status",
        "truncated",
    )

    def __init__(self, rid, monitor, out, err, limit, timeout):
        self.rid = rid
        self.monitor = monitor
        self.out = out
        self.err = err
        self.limit = limit
        self.start = time.monotonic()
        self.deadline = self.start + timeout + BACKSTOP_SECONDS
        self.eof_deadline = None
        self.status = None
        self.sent = [0, 0]
        self.truncated = False
        self.cancelled = False


class Agent:
    def __init__(self, config):
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
        self.execs = {}
        self.by_monitor = {}
        self.inbuf = bytearray()
        self.status_buf = b""
        self.devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        self.status_r, self.status_w = os.pipe()
        self.wake_r, self.wake_w = os.pipe()
        self.running = True

    # -- setup ---------------------------------------------------------------
    def setup(self):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for sig in (signal.SIGUSR1, signal.SIGALRM, signal.SIGCHLD):
            signal.signal(sig, _noop)
        os.set_blocking(self.wake_w, False)
        os.set_blocking(self.wake_r, False)
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        subreaper = prctl(PR_SET_CHILD_SUBREAPER, 1)
        if self.config.get("die_with_parent"):
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() == 1 and os.getpid() != 1:  # pragma: no cover - the parent is already gone
                os._exit(1)
        os.set_blocking(0, False)
        os.set_blocking(self.status_r, False)
        self.sel.register(0, selectors.EVENT_READ, "in")
        self.sel.register(self.wake_r, selectors.EVENT_READ, "sig")
        self.sel.register(self.status_r, selectors.EVENT_READ, "st")
        for name in self.config.get("preload") or ():
            try:
                __import__(name)
            except Exception:  # noqa: S112 - a module missing from this image is simply not preloaded
                continue
        hello = {
            "pid": os.getpid(),
            "python": sys.version.split()[0],
            "subreaper": subreaper,
        }
        self.send(0, R_HELLO, pack_meta(hello))

    # -- I/O -------------------------------------------------------------------
    def send(self, rid, ftype, payload=b""):
        header = HEADER.pack(rid, ftype, len(payload))
        if len(payload) < 4096:
            write_all(1, header + payload)
            return
        write_all(1, header)
        write_all(1, payload)

    def fail(self, rid, kind, message):
        self.send(rid, R_FAIL, pack_meta({"k": kind, "m": message}))

    def serve(self):
        self.setup()
        while self.running:
            timeout = self.next_timeout()
            for key, _ in self.sel.select(timeout):
                tag = key.data
                if tag == "in":
                    self.on_input()
                elif tag == "sig":
                    self.on_signal()
                elif tag == "st":
                    self.on_status()
                else:
                    self.on_output(tag[0], tag[1], key.fd)
                if not self.running:
                    break
            self.check_deadlines()
        self.shutdown()

    def next_timeout(self):
        if not self.execs:
            return None
        now = time.monotonic()
        soonest = min(
            ex.eof_deadline if ex.eof_deadline is not None else ex.deadline for ex in self.execs.values()
        )
        return max(0.0, min(soonest - now, 1.0))

    def on_input(self):
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

    def dispatch(self, rid, ftype, payload):
        if ftype == T_EXEC or ftype == T_PY:
            self.start_exec(rid, ftype, payload)
        elif ftype == T_KILL:
            ex = self.execs.get(rid)
            if ex is not None:
                ex.cancelled = True
                kill_quietly(ex.monitor, signal.SIGUSR1)
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

    # -- exec ------------------------------------------------------------------
    def start_exec(self, rid, ftype, payload):
        meta, raw = unpack_meta(payload)
        argv = meta.get("a")
        if ftype == T_EXEC and (not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv)):
            raise ValueError("argv must be a non-empty list of str")
        if rid in self.execs:
            raise ValueError(f"request id {rid} is already running")
        env = dict(self.env)
        env.update(meta.get("e") or {})
        cwd = self.map_path(str(meta.get("c") or "/"))
        timeout = float(meta.get("t") or 0)
        limit = int(meta.get("m") or 1 << 24)
        if ftype == T_PY:
            n = int(meta.get("n") or 0)
            stdin, source = raw[:n], raw[n:].decode("utf-8", "surrogateescape")
        else:
            stdin, source = raw, None
        stdin_fd = self.devnull
        if stdin:
            stdin_fd = os.memfd_create("stdin", os.MFD_CLOEXEC)
            write_all(stdin_fd, stdin)
            os.lseek(stdin_fd, 0, os.SEEK_SET)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        status_fd = self.status_w
        monitor = Monitor(rid, status_fd, timeout)
        if source is None:
            path = which(argv[0], env)

            def start():
                if path is None:
                    raise FileNotFoundError(errno.ENOENT, "not found", argv[0])
                return os.posix_spawn(path, argv, env, setpgroup=0, setsigmask=(), setsigdef=_SIGDEF)

        else:

            def start():
                pid = os.fork()
                if pid == 0:
                    code = 1
                    try:
                        code = run_source(source, env, status_fd)
                    finally:
                        os._exit(code)
                return pid

        try:
            pid = os.fork()
        except OSError as exc:
            for fd in (out_r, out_w, err_r, err_w):
                os.close(fd)
            if stdin_fd != self.devnull:
                os.close(stdin_fd)
            self.send(rid, R_ERR, f"cwsandbox: cannot start the command: {exc}\n".encode())
            self.send(rid, R_DONE, pack_meta({"rc": SPAWN_FAILED, "w": 0.0, "u": 0.0, "to": False, "tr": False}))
            return
        if pid == 0:
            try:
                monitor.run(self, stdin_fd, out_w, err_w, cwd, self.limits, start)
            finally:
                os._exit(SPAWN_FAILED)
        os.close(out_w)
        os.close(err_w)
        if stdin_fd != self.devnull:
            os.close(stdin_fd)
        os.set_blocking(out_r, False)
        os.set_blocking(err_r, False)
        ex = Exec(rid, pid, out_r, err_r, limit, timeout)
        self.execs[rid] = ex
        self.by_monitor[pid] = ex
        self.sel.register(out_r, selectors.EVENT_READ, (ex, 0))
        self.sel.register(err_r, selectors.EVENT_READ, (ex, 1))

    def on_output(self, ex, which_stream, fd):
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
            kill_quietly(ex.monitor, signal.SIGUSR1)
        if data:
            ex.sent[which_stream] += len(data)
            self.send(ex.rid, R_OUT if which_stream == 0 else R_ERR, data)

    def close_stream(self, ex, which_stream):
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

    def on_status(self):
        try:
            data = os.read(self.status_r, CHUNK)
        except BlockingIOError:
            return
        lines = (self.status_buf + data).split(b"\n")
        self.status_buf = lines.pop()
        for line in lines:
            rid_s, rc_s, cpu_s, to_s = line.split()
            ex = self.execs.get(int(rid_s))
            if ex is not None and ex.status is None:
                ex.status = (int(rc_s), float(cpu_s), to_s == b"1")
                ex.eof_deadline = time.monotonic() + EOF_GRACE_SECONDS
                self.maybe_finish(ex)

    def on_signal(self):
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
            ex = self.by_monitor.pop(pid, None)
            if ex is not None and ex.status is None:
                self.on_status()  # the report may be waiting in the pipe
                if ex.status is None:
                    rc = os.waitstatus_to_exitcode(status)
                    ex.status = (rc if rc < 0 else -signal.SIGKILL, 0.0, time.monotonic() >= ex.deadline)
                    ex.eof_deadline = time.monotonic() + EOF_GRACE_SECONDS
                    self.maybe_finish(ex)
        self.kill_orphans()

    def kill_orphans(self):
        """Anything re-parented to us that is not a monitor escaped its exec: kill it."""
        for pid in children_of(os.getpid()):
            if pid not in self.by_monitor:
                kill_quietly(pid, signal.SIGKILL)

    def check_deadlines(self):
        if not self.execs:
            return
        now = time.monotonic()
        for ex in list(self.execs.values()):
            if ex.status is None and now >= ex.deadline:
                kill_quietly(ex.monitor, signal.SIGKILL)
                ex.deadline = now + BACKSTOP_SECONDS
            elif ex.eof_deadline is not None and now >= ex.eof_deadline:
                for which_stream in (0, 1):
                    self.close_stream(ex, which_stream)

    def maybe_finish(self, ex):
        if ex.status is None or ex.out >= 0 or ex.err >= 0:
            return
        del self.execs[ex.rid]
        rc, cpu, timed_out = ex.status
        done = {
            "rc": rc,
            "w": round(time.monotonic() - ex.start, 6),
            "u": cpu,
            "to": timed_out,
            "tr": ex.truncated,
        }
        self.send(ex.rid, R_DONE, pack_meta(done))

    # -- files -----------------------------------------------------------------
    def map_path(self, path):
        for inside, outside in self.path_map:
            if path == inside or path.startswith(inside.rstrip("/") + "/"):
                return outside + path[len(inside.rstrip("/")) :]
        return path

    def read_file(self, rid, payload):
        meta, _ = unpack_meta(payload)
        path = self.map_path(str(meta["p"]))
        limit = int(meta["m"])
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
        except OSError as exc:
            return self.fail(rid, "file", f"{meta['p']}: {exc.strerror}")
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                return self.fail(rid, "file", f"{meta['p']}: is a directory")
            if not stat.S_ISREG(st.st_mode):
                return self.fail(rid, "file", f"{meta['p']}: not a regular file")
            if st.st_size > limit:
                return self.fail(rid, "file", f"{meta['p']}: {st.st_size} bytes is more than {limit}")
            chunks = []
            total = 0
            while True:
                data = os.read(fd, min(1 << 20, limit + 1 - total))
                if not data:
                    break
                total += len(data)
                chunks.append(data)
                if total > limit:
                    return self.fail(rid, "file", f"{meta['p']}: more than {limit} bytes")
        except OSError as exc:
            return self.fail(rid, "file", f"{meta['p']}: {exc.strerror}")
        finally:
            os.close(fd)
        self.send(rid, R_DATA, b"".join(chunks))
        return None

    def write_file(self, rid, payload):
        meta, data = unpack_meta(payload)
        shown = str(meta["p"])
        path = self.map_path(shown)
        if self.file_limit and len(data) > self.file_limit:
            return self.fail(rid, "file", f"{shown}: {len(data)} bytes is over the file size limit")
        try:
            parent = os.path.dirname(path)
            if parent:
                os.makedirs(parent, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOCTTY, 0o644)
            try:
                write_all(fd, data)
            finally:
                os.close(fd)
        except OSError as exc:
            return self.fail(rid, "file", f"{shown}: {exc.strerror}")
        self.send(rid, R_OK)
        return None

    # -- exit ------------------------------------------------------------------
    def shutdown(self):
        for ex in self.execs.values():
            kill_quietly(ex.monitor, signal.SIGUSR1)
        deadline = time.monotonic() + 0.5
        while self.by_monitor and time.monotonic() < deadline:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                time.sleep(0.005)
            self.by_monitor.pop(pid, None)
        for pid in children_of(os.getpid()):
            kill_quietly(pid, signal.SIGKILL)
        os._exit(0)


def _noop(signum, frame):
    pass


def main(argv):
    config = json.loads(argv[1]) if len(argv) > 1 else {}
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
