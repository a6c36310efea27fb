"""The agent's exec workers (stdlib only).

A worker is born from the agent's template (``template``), as a child of the
agent, and runs one command at a time, reused for the next. At birth it starts a
new session, becomes a *child subreaper*, asks to die with the agent, raises its
OOM score (so the OOM killer prefers commands over the agent) and applies the
sandbox's rlimits, which every command inherits. Then it says hello (its pid).

Per exec, the agent sends a fixed-size order (``WREQ``: request id, timeout, CPU
budget, flags) with four file descriptors (SCM_RIGHTS): a memfd holding the
request (cwd, environment, argv or Python source), the command's stdin, stdout
and stderr. The worker acknowledges at once (``ACK``), then:

- for Python source it forks, and the child reads the request itself
  (``child.python_child``): the worker never reads a request's bytes, so it stays
  *clean* and the agent may send it Python again;
- for a command it reads the argv and environment itself (it is *dirty* from then
  on: the agent never sends it Python source again) and starts the command with
  ``posix_spawn`` in its own process group.

It then waits on a pidfd for the command to exit, on its socket for a kill order,
and on the clock for the timeout and the next sample of the command's tree
(``proctree.TreeSampler``: CPU time for the budget, run-queue wait). When the
command ends or is killed, the worker SIGKILLs its process group and then every
remaining descendant: orphans (double-forked or ``setsid`` daemons) are
re-parented to the worker, as a subreaper, so nothing started by an exec outlives
it. The deadline is checked where the command ends: a command that ends past its
timeout (say because it stopped its worker for a while) is reported timed out
however it ended; the CPU budget likewise. The report is ``WREP``.

A closed socket means exit; a busy worker then kills its command tree first.
"""

from __future__ import annotations

import errno
import os
import resource
import select
import signal
import socket
import struct
import time

from . import child, proctree, protocol, sysapi
from .files import write_all

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn

#: agent -> worker: kind, request id, timeout (s, 0 = none), CPU budget (s, 0 = none), flags
WREQ = struct.Struct("=BIddB")
W_RUN = 1
W_KILL = 2
F_PY = 1
#: worker -> agent: kind, request id (the worker's pid in HELLO), return code, wall s, CPU s,
#: run-queue wait s (negative: not measured), flags
WREP = struct.Struct("=BIidddB")
K_HELLO = 1
K_ACK = 2
K_DONE = 3
D_TIMED_OUT = 1
D_CPU_EXCEEDED = 2
#: The command itself died of SIGKILL and neither the worker nor the agent sent it (OOM evidence).
D_UNEXPLAINED_KILL = 4
N_FDS = 4


def exit_status(status: int) -> int:
    """A wait status as a return code (negative: killed by that signal)."""
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


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


def max_fd() -> int:
    """One past the highest fd a worker closes at birth (``RLIMIT_NOFILE``, bounded)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return soft if 0 < soft <= 1 << 20 else 1 << 16


class Worker:
    """The worker process's side. ``serve`` never returns."""

    def __init__(self, sock: socket.socket, config: dict[str, Any], settings: Any, cpus: float) -> None:
        self.sock = sock
        self.limits: dict[str, int] = dict(config.get("limits") or {})
        self.oom_adjust = bool(config.get("oom_adjust", True))
        self.settings = settings
        self.cpus = cpus
        self.buf = b""
        self.rid = 0
        self.child = 0
        self.killed = False

    def setup(self, max_fd: int) -> None:
        os.setsid()
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGUSR1, signal.SIGALRM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        sysapi.prctl(sysapi.PR_SET_CHILD_SUBREAPER, 1)
        sysapi.prctl(sysapi.PR_SET_PDEATHSIG, signal.SIGKILL)
        sysapi.prctl(sysapi.PR_SET_DUMPABLE, 0)
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
        self.send(K_HELLO, os.getpid())

    def serve(self, max_fd: int) -> NoReturn:
        try:
            self.setup(max_fd)
            for _ in range(int(self.settings.max_execs)):
                order = self.receive()
                if order is None:
                    break
                self.run(*order)
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            os._exit(0)

    # -- messages --------------------------------------------------------------
    def send(self, kind: int, rid: int, rc: int = 0, wall: float = 0.0, cpu: float = 0.0, *more: float) -> None:
        """One report; ``more`` = (run-queue wait, flags), default (-1, 0)."""
        wait, flags = (more[0], int(more[1])) if more else (-1.0, 0)
        self.sock.sendall(WREP.pack(kind, rid, rc, wall, cpu, wait, flags))

    def receive(self) -> tuple[int, float, float, int, list[int]] | None:
        """The next run order and its fds (stale kill orders skipped); None when the agent closed the socket."""
        fds: list[int] = []
        while True:
            if len(self.buf) < WREQ.size:
                data, anc, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(N_FDS * 4), socket.MSG_CMSG_CLOEXEC)
                for level, kind, payload in anc:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                        usable = len(payload) - len(payload) % 4
                        fds.extend(struct.unpack(f"{usable // 4}i", payload[:usable]))
                if not data:
                    return None
                self.buf += data
                continue
            kind, rid, timeout, budget, flags = WREQ.unpack_from(self.buf)
            self.buf = self.buf[WREQ.size :]
            if kind != W_RUN:
                continue
            if len(fds) < N_FDS:  # a run order always carries its fds; without them there is nothing to run
                for fd in fds:
                    os.close(fd)
                fds = []
                continue
            return rid, timeout, budget, flags, fds

    def on_message(self) -> bool:
        """Handle kill orders that arrived while a command runs; False when the agent went away."""
        data = self.sock.recv(4096)
        if not data:
            return False
        self.buf += data
        while len(self.buf) >= WREQ.size:
            kind, rid, _, _, _ = WREQ.unpack_from(self.buf)
            self.buf = self.buf[WREQ.size :]
            if kind == W_KILL and rid == self.rid:
                self.killed = True
                self.kill_group()
        return True

    # -- one exec --------------------------------------------------------------
    def kill_group(self) -> None:
        if self.child:
            proctree.kill_quietly(-self.child, signal.SIGKILL)
            proctree.kill_quietly(self.child, signal.SIGKILL)

    def run(self, rid: int, timeout: float, budget: float, flags: int, fds: list[int]) -> None:
        self.rid = rid
        self.child = 0
        self.killed = False
        self.send(K_ACK, rid)
        sampler = proctree.TreeSampler(os.getpid(), self.cpus)
        start = time.monotonic()
        try:
            if flags & F_PY:
                pid = os.fork()
                if pid == 0:
                    child.python_child(fds, [self.sock.fileno()])
                self.child = pid
            else:
                self.child = self.spawn(fds)
        except OSError as exc:
            return self.fail(protocol.SPAWN_FAILED, f"cannot start the command: {exc.strerror or exc}", fds)
        except ValueError as exc:
            return self.fail(protocol.SPAWN_FAILED, f"malformed request: {exc}", fds)
        except _SpawnError as exc:
            return self.fail(exc.rc, exc.message, fds)
        for fd in fds:
            os.close(fd)
        timed_out, cpu_exceeded = self.wait(timeout, budget, sampler, start)
        wall = time.monotonic() - start
        if timed_out or cpu_exceeded or sampler.sampled:
            sampler.sample()  # the command is a zombie now: its last figures are still readable
        _, status, _ = os.wait4(self.child, 0)
        proctree.kill_quietly(-self.child, signal.SIGKILL)
        proctree.reap_descendants()
        cpu = sampler.final_cpu()
        rc = exit_status(status)
        out = 0
        if timed_out or (timeout > 0 and wall >= timeout):
            out |= D_TIMED_OUT
        if cpu_exceeded or (budget > 0 and cpu > budget):
            out |= D_CPU_EXCEEDED
        if rc == -signal.SIGKILL and not (self.killed or timed_out or cpu_exceeded):
            out |= D_UNEXPLAINED_KILL
        wait = sampler.cpu_wait(wall, cpu)
        self.send(K_DONE, rid, rc, wall, cpu, -1.0 if wait is None else wait, out)
        return None

    def spawn(self, fds: list[int]) -> int:
        """Start a command (argv, env, cwd read from the request memfd) in its own process group."""
        meta, _ = child.read_request(fds[0])
        argv = [str(a) for a in meta["a"]]
        env = {str(k): str(v) for k, v in dict(meta["e"]).items()}
        cwd = str(meta["c"])
        try:
            os.chdir(cwd)
        except OSError as exc:
            raise _SpawnError(protocol.SPAWN_FAILED, f"cannot change directory to {cwd!r}: {exc.strerror}") from None
        path = which(argv[0], env)
        try:
            if path is None:
                raise FileNotFoundError(errno.ENOENT, "not found", argv[0])
            actions = [(os.POSIX_SPAWN_DUP2, fds[1 + i], i) for i in range(3)]
            return os.posix_spawn(
                path, argv, env, file_actions=actions, setpgroup=0, setsigmask=(), setsigdef=child.DEFAULT_SIGNALS
            )
        except FileNotFoundError as exc:
            raise _SpawnError(protocol.NOT_FOUND, f"{exc.filename or 'command'}: command not found") from None
        except PermissionError as exc:
            raise _SpawnError(protocol.SPAWN_FAILED, f"{exc.filename or 'command'}: permission denied") from None

    def wait(self, timeout: float, budget: float, sampler: proctree.TreeSampler, start: float) -> tuple[bool, bool]:
        """Wait for the command to exit, killing it at the timeout or past its budget; (timed out, over budget)."""
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        try:
            pidfd = os.pidfd_open(self.child)
            poller.register(pidfd, select.POLLIN)
        except (AttributeError, OSError):
            pidfd = -1
        deadline = start + timeout if timeout > 0 else None
        interval = float(self.settings.sample_interval)
        next_sample = start + interval
        timed_out = over = False
        try:
            while True:
                now = time.monotonic()
                wake = next_sample
                if deadline is not None and not timed_out:
                    wake = min(wake, deadline)
                wait_ms = max(0, int((wake - now) * 1000) + 1)
                if pidfd < 0:
                    wait_ms = min(wait_ms, 10)
                for fd, _ in poller.poll(wait_ms):
                    if fd == pidfd:
                        return timed_out, over
                    if not self.on_message():  # the agent is gone: nothing will read a report
                        self.kill_group()
                        proctree.reap_descendants()
                        os._exit(0)
                now = time.monotonic()
                if deadline is not None and not timed_out and now >= deadline:
                    timed_out = True
                    self.kill_group()
                if now >= next_sample:
                    sampler.sample()
                    next_sample = now + interval
                    if budget > 0 and not over and sampler.cpu() >= budget:
                        over = True
                        self.kill_group()
                if pidfd < 0 and os.waitid(os.P_PID, self.child, os.WEXITED | os.WNOHANG | os.WNOWAIT):
                    return timed_out, over
        finally:
            if pidfd >= 0:
                os.close(pidfd)

    def fail(self, rc: int, message: str, fds: list[int]) -> None:
        try:
            write_all(fds[3], f"cwsandbox: {message}\n".encode())
        except OSError:
            pass
        for fd in fds:
            os.close(fd)
        self.send(K_DONE, self.rid, rc, 0.0, 0.0, -1.0, 0)


class _SpawnError(Exception):
    def __init__(self, rc: int, message: str) -> None:
        super().__init__(message)
        self.rc = rc
        self.message = message
