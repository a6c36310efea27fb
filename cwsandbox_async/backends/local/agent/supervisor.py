"""The agent's processes: its template and workers, born, supervised, retired (stdlib only).

The template and every worker are the agent's children (workers are cloned by the
template with ``CLONE_PARENT``). ``reap`` waits for them with ``WUNTRACED``: a
stopped worker is killed (its command tree is then the agent's, killed as
orphans), a stopped template is continued, a dead one is replaced by a fresh
interpreter when the next worker is needed (the agent's own memory holds
requests, so it never forks a template after its first). Anything else
re-parented to the agent escaped its exec and is killed.

Workers are born on demand; one spare is kept while requests come; after
``idle_trim`` seconds without one every idle worker retires, leaving the agent and
the template. ``scheduler.Scheduler`` builds on this with the execs.
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import sys
import time

from . import proctree, sysapi, template
from .execs import STOPPED_ITS_WORKER, WorkerHandle
from .worker import Worker, max_fd

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .settings import Settings


class Supervisor:
    """The template and the workers (see the module docstring)."""

    def __init__(self, config: dict[str, Any], settings: Settings, boot: dict[str, Any]) -> None:
        self.config = config
        self.settings = settings
        self.boot = boot
        self.cpus = float(boot.get("cpus") or 1.0)
        self.max_fd = max_fd()
        self.sel = selectors.EpollSelector()
        self.running = True
        self.subreaper = False
        self.workers: dict[int, WorkerHandle] = {}  # by pid (after hello)
        self.starting: list[WorkerHandle] = []  # asked of the template, no hello yet
        self.idle: list[WorkerHandle] = []
        self.template_pid = 0
        self.template_sock: socket.socket | None = None
        cgroup = boot.get("cgroup") or {}
        #: ``cgroup.procs`` fds of the commands' cgroup(s): each template writes itself in (see ``main``)
        self.joins: list[int] = [int(fd) for fd in cgroup.get("cmd_procs") or ()]
        self.refill_after = 0.0
        self.last_exec = time.monotonic()
        #: a frame arrived: no worker is born before that (see start_machinery), and the agent's memory
        #: now holds request data, so it never forks a template again
        self.served = False
        self.execs: dict[int, Any] = {}  # the scheduler's; here only to know whether the sandbox is busy

    def start_machinery(self) -> None:
        """Not dumpable, subreaper, and the template (forked by ``main.run`` already, else now) -- all
        before any request. Workers are born only once the first request arrived."""
        # Not dumpable (the template and workers inherit it; commands, being exec'd or made
        # dumpable again, do not): commands cannot ptrace them or read their memory or fds.
        sysapi.prctl(sysapi.PR_SET_DUMPABLE, 0)
        self.subreaper = sysapi.prctl(sysapi.PR_SET_CHILD_SUBREAPER, 1)
        if self.config.get("die_with_parent"):
            sysapi.prctl(sysapi.PR_SET_PDEATHSIG, signal.SIGKILL)
        early = self.boot.get("template")
        if early is not None:  # forked by ``main.run`` already, before this object existed
            self.template_pid, self.template_sock = early
            self.sel.register(self.template_sock, selectors.EVENT_READ, "template")
        else:
            self.fork_template()

    def fork_template(self) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pid = os.fork() if self.template_pid == 0 and not self.served else -1
        if pid == 0:
            mine.close()
            template.serve(theirs, self.birth, joins=[os.dup(fd) for fd in self.joins])
        if pid < 0:  # the agent has read requests: its memory is not clean, start a new interpreter
            try:
                config = {**self.config, "role": "template", "joins": len(self.joins)}
                payload = self.boot["payload"](config)
                pid = template.spawn_fresh(sys.executable, self.boot["bootstrap"], payload, theirs.fileno(), self.joins)
            except (OSError, KeyError) as exc:
                sys.stderr.write(f"cwsandbox agent: cannot start a template: {exc}\n")
                pid = 0
        theirs.close()
        if pid <= 0:
            mine.close()
            return
        self.template_pid, self.template_sock = pid, mine
        self.sel.register(mine, selectors.EVENT_READ, "template")

    def birth(self, sock: socket.socket) -> Any:
        """In a new worker (a clone of the template): serve."""
        Worker(sock, self.config, self.settings, self.cpus).serve(self.max_fd)

    def template_gone(self) -> None:
        if self.template_sock is not None:
            self.sel.unregister(self.template_sock)
            self.template_sock.close()
        self.template_sock, self.template_pid = None, 0

    def on_template(self) -> None:
        try:
            data = self.template_sock.recv(64) if self.template_sock is not None else b""
        except OSError:
            data = b""
        if not data:
            self.template_gone()

    def request_worker(self) -> bool:
        """Ask the template for a new worker (starting a template if needed); False if impossible now."""
        if self.template_sock is None:
            self.fork_template()
        if self.template_sock is None:
            return False
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.template_sock.sendmsg([b"W"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, _fd(theirs.fileno()))])
        except OSError:
            mine.close()
            return False
        finally:
            theirs.close()
        handle = WorkerHandle(mine)
        self.starting.append(handle)
        self.sel.register(mine, selectors.EVENT_READ, handle)
        return True

    def retire(self, handle: WorkerHandle) -> None:
        """Close a worker's socket: an idle worker exits when it reads the end."""
        for pool in (self.idle, self.starting):
            if handle in pool:
                pool.remove(handle)
        try:
            self.sel.unregister(handle.sock)
        except (KeyError, ValueError):
            pass
        handle.sock.close()

    def close_machinery(self) -> None:
        for handle in [*self.workers.values(), *self.starting]:
            try:
                handle.sock.close()
            except OSError:
                pass
        if self.template_sock is not None:
            self.template_sock.close()

    def children_left(self) -> bool:
        return bool(proctree.children_of(os.getpid()))

    def take_worker(self, py: bool) -> WorkerHandle | None:
        for handle in reversed(self.idle):
            if not (py and handle.dirty):
                self.idle.remove(handle)
                return handle
        return None

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG | os.WUNTRACED)
            except ChildProcessError:
                break
            if pid == 0:
                break
            stopped = os.WIFSTOPPED(status)
            if pid == self.template_pid:
                if stopped:
                    proctree.kill_quietly(pid, signal.SIGCONT)
                else:
                    self.template_gone()
                continue
            handle = self.workers.get(pid)
            if handle is not None and stopped:
                handle.stopped = True
                if handle.busy is not None and handle.busy.acked and not handle.busy.note:
                    handle.busy.note = STOPPED_ITS_WORKER
                proctree.kill_quietly(pid, signal.SIGKILL)  # its command tree is then ours: kill_orphans
            elif handle is not None:
                del self.workers[pid]
                self.worker_gone(handle, status)
            elif stopped:
                proctree.kill_quietly(pid, signal.SIGKILL)
        self.kill_orphans()
        self.schedule()

    def kill_orphans(self) -> int:
        """Anything re-parented to us that is not ours escaped its exec: kill it. How many are left alive."""
        if self.starting:  # a worker that was just born has not said who it is yet: look again later
            return 1
        left = 0
        for pid in proctree.children_of(os.getpid()):
            if pid not in self.workers and pid != self.template_pid and proctree.alive(pid):
                proctree.kill_quietly(pid, signal.SIGKILL)
                left += 1
        return left

    def active(self) -> bool:
        """A request arrived within the last ``idle_trim`` seconds (then a spare worker is kept)."""
        return self.served and (bool(self.execs) or time.monotonic() < self.last_exec + self.settings.idle_trim)

    def trimmable(self) -> list[WorkerHandle]:
        """The idle workers ``maintain`` retires once the sandbox is idle (none while an exec runs)."""
        if self.execs:
            return []
        keep = None if self.template_sock is not None else next((h for h in self.idle if not h.dirty), None)
        return [h for h in self.idle if h is not keep]

    def maintain(self, idle: bool, now: float) -> None:
        """Keep one spare worker while requests come; after ``idle_trim`` without any, retire every idle
        worker (the template births the next one in about a millisecond; an idle sandbox then holds
        only the agent and the template). Without a live template one clean worker is kept."""
        if self.trimmable() and now >= self.last_exec + self.settings.idle_trim:
            for handle in self.trimmable():
                self.retire(handle)
        spare = idle and self.active() and not self.idle and not self.starting and now >= self.refill_after
        if spare and not self.request_worker():  # at the pids limit (a fork bomb?): try again later
            self.refill_after = now + self.settings.refill_pause

    # -- the scheduler's --------------------------------------------------------------
    def worker_gone(self, handle: WorkerHandle, status: int | None) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def schedule(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


def _fd(fd: int) -> bytes:
    import array

    return array.array("i", [fd]).tobytes()
