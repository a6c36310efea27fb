"""The agent's execs: queueing, handing out, finishing (stdlib only; see ``server``).

Life of an exec: ``submit`` queues it; ``schedule`` hands it to an idle worker
(Python source only to a clean one; a worker is born from the template when none
fits) by sending the order and four fds; the worker acknowledges (else, once
``ack_timeout`` passed and the worker is found stopped or gone, the exec goes to
another worker with fresh pipes); the worker reports ``DONE``; once both output
pipes closed (or ``eof_grace`` passed) the agent sends ``DONE`` to the client.
How its facts are decided: ``execs``. The workers themselves: ``supervisor``.
"""

from __future__ import annotations

import collections
import os
import selectors
import signal
import time

from . import oom, proctree
from .execs import KILLED_BY_EXCLUSIVE, Exec, WorkerHandle
from .files import write_all
from .protocol import R_DONE, R_ERR, SPAWN_FAILED, pack_meta, unpack_meta
from .supervisor import Supervisor
from .worker import (
    D_CPU_EXCEEDED,
    D_TIMED_OUT,
    D_UNEXPLAINED_KILL,
    F_PY,
    K_ACK,
    K_DONE,
    K_HELLO,
    W_KILL,
    W_RUN,
    WREP,
    WREQ,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .settings import Settings

#: How often an exclusive exec re-checks that the sandbox's other processes are gone.
_EXCLUSIVE_POLL = 0.005


class Scheduler(Supervisor):
    """The execs (``server.Agent`` adds the I/O)."""

    def __init__(self, config: dict[str, Any], settings: Settings, boot: dict[str, Any]) -> None:
        super().__init__(config, settings, boot)
        self.env = dict(config.get("env") or {})
        self.execs: dict[int, Exec] = {}
        self.queue: collections.deque[Exec] = collections.deque()
        self.exclusive: Exec | None = None  # the exclusive exec running, if any
        self.devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        cgroup = boot.get("cgroup") or {}
        events = cgroup.get("cmd_events")
        self.oom = oom.Counter(config.get("oom_files"), None if events is None else int(events))
        usage = cgroup.get("sandbox_cpu")
        self.sandbox_cpu = proctree.SandboxCpu(None if usage is None else int(usage))

    # -- requests --------------------------------------------------------------------
    def submit(self, rid: int, py: bool, payload: bytes) -> None:
        meta, raw = unpack_meta(payload)
        argv = meta.get("a")
        if not py and (not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv)):
            raise ValueError("argv must be a non-empty list of str")
        if rid in self.execs:
            raise ValueError(f"request id {rid} is already running")
        env = dict(self.env)
        env.update(meta.get("e") or {})
        cwd = self.map_cwd(str(meta.get("c") or "/"))
        if py:
            n = int(meta.get("n") or 0)
            stdin, source = raw[:n], raw[n:]
            request = pack_meta({"c": cwd, "e": env}, source)
        else:
            stdin = raw
            request = pack_meta({"a": argv, "c": cwd, "e": env})
        ex = Exec(rid, py, meta, request, stdin)
        self.execs[rid] = ex
        self.queue.append(ex)
        self.last_exec = time.monotonic()
        self.schedule()

    def map_cwd(self, cwd: str) -> str:
        return cwd

    def cancel(self, rid: int) -> None:
        """The client gave up on an exec (or its output hit the cap): kill its command."""
        ex = self.execs.get(rid)
        if ex is None:
            return
        if ex.handle is None:
            if ex in self.queue:
                self.queue.remove(ex)
            del self.execs[rid]  # never started: nothing to report to a client that left
            self.schedule()
            return
        ex.handle.order(WREQ.pack(W_KILL, rid, 0.0, 0.0, 0))

    def schedule(self) -> None:
        """Hand queued execs to workers, in order; an exclusive exec runs alone."""
        if self.exclusive is not None:
            return
        wanted = 0
        for ex in list(self.queue):
            if ex.exclusive and (ex is not self.queue[0] or not self.clear_for(ex)):
                break
            handle = self.take_worker(ex.py)
            if handle is None:
                wanted += 1
                if ex.exclusive:
                    break
                continue
            self.queue.remove(ex)
            self.hand(ex, handle)
            if ex.exclusive:
                self.exclusive = ex
                break
        if time.monotonic() < self.refill_after:
            return  # a birth just failed (the pids limit?): try again at refill_after
        for _ in range(max(0, wanted - len(self.starting))):
            if not self.request_worker():
                self.birth_failed()
                break

    def birth_failed(self) -> None:
        """No worker could be born (the sandbox's pids limit, most likely: the program's own doing). The
        oldest queued exec ends at once with ``SPAWN_FAILED``, the rest wait ``refill_pause``."""
        self.refill_after = time.monotonic() + self.settings.refill_pause
        if not self.queue:
            return
        ex = self.queue.popleft()
        del self.execs[ex.rid]
        self.send(ex.rid, R_ERR, b"cwsandbox: cannot start the command: no process available (pids limit?)\n")
        done = {"rc": SPAWN_FAILED, "w": 0.0, "u": 0.0, "to": False, "tr": False, "oom": False, "cx": False}
        self.send(ex.rid, R_DONE, pack_meta({**done, "cw": None, "sc": None}))

    def clear_for(self, ex: Exec) -> bool:
        """Kill every other exec's processes; True once none is left (then ``ex`` may run)."""
        now = time.monotonic()
        if ex.wait_until is None:
            ex.wait_until = now + self.settings.exclusive_wait
        busy = False
        for other in self.execs.values():
            if other is not ex and other.running:
                busy = True
                if not other.note:
                    other.note = KILLED_BY_EXCLUSIVE
                assert other.handle is not None
                other.handle.order(WREQ.pack(W_KILL, other.rid, 0.0, 0.0, 0))
                for pid in proctree.descendants(other.handle.pid):
                    proctree.kill_quietly(pid, signal.SIGKILL)
        stray = self.kill_orphans()
        if not busy and not stray:
            ex.wait_until = None
            return True
        if now >= ex.wait_until:
            self.queue.remove(ex)
            del self.execs[ex.rid]
            self.fail(ex.rid, "internal", "an exclusive exec could not stop the sandbox's other processes in time")
        return False

    def hand(self, ex: Exec, handle: WorkerHandle) -> None:
        """Send ``ex`` to ``handle`` with a fresh request memfd, stdin and output pipes."""
        req = os.memfd_create("request", os.MFD_CLOEXEC)
        write_all(req, ex.request)
        os.lseek(req, 0, os.SEEK_SET)
        stdin = self.devnull
        if ex.stdin:
            stdin = os.memfd_create("stdin", os.MFD_CLOEXEC)
            write_all(stdin, ex.stdin)
            os.lseek(stdin, 0, os.SEEK_SET)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        order = WREQ.pack(W_RUN, ex.rid, ex.timeout, ex.budget, F_PY if ex.py else 0)
        ok = handle.order(order, [req, stdin, out_w, err_w])
        ex.held = [req, out_w, err_w] + ([stdin] if stdin != self.devnull else [])
        ex.out, ex.err = out_r, err_r
        for fd in (out_r, err_r):
            os.set_blocking(fd, False)
        self.sel.register(out_r, selectors.EVENT_READ, (ex, 0))
        self.sel.register(err_r, selectors.EVENT_READ, (ex, 1))
        now = time.monotonic()
        ex.start = now
        ex.deadline = now + ex.timeout + self.settings.backstop if ex.timeout > 0 else float("inf")
        ex.ack_deadline = now + self.settings.ack_timeout
        ex.handle, handle.busy = handle, ex
        if not ex.py:
            handle.dirty = True
        if self.oom.enabled:
            ex.oom_before = self.oom.read()
        if self.sandbox_cpu.exact:
            self.start_reading(ex, now)
        else:  # see proctree.SandboxCpu: read a little later, only for execs still running by then
            ex.sandbox_cpu, ex.sandbox_cpu_at = None, now + self.settings.sandbox_cpu_delay
        others = [e for e in self.execs.values() if e is not ex and e.running]
        for e in (ex, *others) if others else ():
            e.overlapped = True
        if not ok:  # the worker is gone; its reaping gives the exec to another
            self.retire(handle)

    def start_reading(self, ex: Exec, now: float) -> None:
        """The sandbox's CPU at (about) ``ex``'s start; no reading at all when it cannot be read."""
        value = self.sandbox_cpu.read()
        ex.sandbox_cpu, ex.sandbox_cpu_at = value, (now if value is not None else None)

    def requeue(self, ex: Exec) -> None:
        """``ex`` never started (its worker did not acknowledge): give it to another worker, fresh."""
        ex.close_held()
        for fd in (ex.out, ex.err):
            if fd >= 0:
                self.sel.unregister(fd)
                os.close(fd)
        ex.out = ex.err = -1
        ex.handle = None
        ex.acked = False
        ex.ack_deadline = ex.deadline = float("inf")
        self.queue.appendleft(ex)

    # -- worker messages ---------------------------------------------------------------
    def on_worker(self, handle: WorkerHandle) -> None:
        try:
            data = handle.sock.recv(4096)
        except OSError:
            data = b""
        if not data:
            self.worker_gone(handle, None)
            return
        handle.buf += data
        while len(handle.buf) >= WREP.size:
            kind, rid, rc, _wall, cpu, wait, flags = WREP.unpack_from(handle.buf)
            handle.buf = handle.buf[WREP.size :]
            if kind == K_HELLO:
                if handle in self.starting:
                    self.starting.remove(handle)
                handle.pid = rid
                self.workers[rid] = handle
                self.idle.append(handle)
                self.kill_orphans()  # a check deferred while this worker had not said who it is
            elif kind == K_ACK and handle.busy is not None and handle.busy.rid == rid:
                handle.busy.acked = True
                handle.busy.close_held()
            elif kind == K_DONE and handle.busy is not None and handle.busy.rid == rid:
                ex = handle.busy
                ex.close_held()
                handle.busy = None
                self.set_status(ex, rc, cpu, flags, wait if wait >= 0 else None)
                self.last_exec = time.monotonic()
                if len(self.idle) < self.settings.max_idle_workers:
                    self.idle.append(handle)
                else:
                    self.retire(handle)
        self.schedule()
        while len(self.idle) > self.settings.max_idle_workers:  # born for a burst that is over
            self.retire(self.idle[0])

    def set_status(self, ex: Exec, rc: int, cpu: float, flags: int, wait: float | None) -> None:
        if ex.status is not None:
            return
        ex.status = (rc, cpu, flags, wait)
        start = ex.sandbox_cpu
        now_cpu = self.sandbox_cpu.read() if start is not None else None
        if start is None or now_cpu is None or ex.sandbox_cpu_at is None:
            ex.sandbox_cpu = None
        else:  # plus what the sandbox could have used before a late start reading (an overestimate)
            ex.sandbox_cpu = round(now_cpu - start + (ex.sandbox_cpu_at - ex.start) * self.cpus, 6)
        if self.exclusive is ex:
            self.exclusive = None
        ex.eof_deadline = time.monotonic() + self.settings.eof_grace
        self.maybe_finish(ex)

    def worker_gone(self, handle: WorkerHandle, status: int | None) -> None:
        """A worker's socket closed or the worker was reaped: requeue or end its exec."""
        if handle.sock.fileno() >= 0:
            self.retire(handle)
        if not handle.pid:  # never born: the template died (a new one is started) or hit the pids limit
            self.kill_orphans()
            if self.template_pid and proctree.alive(self.template_pid):
                self.birth_failed()
        ex, handle.busy = handle.busy, None
        if ex is None:
            return
        if not ex.acked and not ex.note:
            self.requeue(ex)
            return
        rc = -signal.SIGKILL
        if status is not None and os.WIFSIGNALED(status):
            rc = -os.WTERMSIG(status)
        flags = D_TIMED_OUT if ex.timeout > 0 and time.monotonic() - ex.start >= ex.timeout else 0
        self.set_status(ex, rc, 0.0, flags, None)

    # -- time --------------------------------------------------------------------------
    def deadlines(self) -> list[float]:
        out: list[float] = []
        for ex in self.execs.values():
            if ex.eof_deadline is not None:
                out.append(ex.eof_deadline)
            elif ex.handle is not None:
                out.append(ex.deadline if ex.acked else ex.ack_deadline)
                if ex.sandbox_cpu is None and ex.sandbox_cpu_at is not None:
                    out.append(ex.sandbox_cpu_at)
            elif ex.wait_until is not None:
                out.append(time.monotonic() + _EXCLUSIVE_POLL)
        if (self.queue or self.active()) and not self.idle and not self.starting:
            out.append(max(time.monotonic() + 0.002, self.refill_after))
        elif self.trimmable():
            out.append(self.last_exec + self.settings.idle_trim)
        return out

    def check_deadlines(self, now: float) -> None:
        for ex in list(self.execs.values()):
            handle = ex.handle
            if ex.running and ex.sandbox_cpu is None and ex.sandbox_cpu_at is not None and now >= ex.sandbox_cpu_at:
                self.start_reading(ex, now)
            if ex.eof_deadline is not None:
                if now >= ex.eof_deadline:
                    for which_stream in (0, 1):
                        self.close_stream(ex, which_stream)
            elif handle is not None and not ex.acked and now >= ex.ack_deadline:
                if proctree.state(handle.pid) in (None, "T", "t", "Z"):  # stopped or gone: use another
                    proctree.kill_quietly(handle.pid, signal.SIGKILL)
                    handle.busy = None
                    self.retire(handle)
                    self.requeue(ex)
                else:  # alive, just slow (a loaded machine): keep waiting
                    ex.ack_deadline = now + self.settings.ack_timeout
            elif handle is not None and ex.status is None and now >= ex.deadline:
                ex.backstopped = True
                proctree.kill_quietly(handle.pid, signal.SIGKILL)  # its command tree is then ours
                ex.deadline = now + self.settings.backstop
        if self.queue:
            self.schedule()

    # -- finishing -----------------------------------------------------------------------
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

    def maybe_finish(self, ex: Exec) -> None:
        if ex.status is None or ex.out >= 0 or ex.err >= 0 or ex.rid not in self.execs:
            return
        del self.execs[ex.rid]
        rc, cpu, flags, wait = ex.status
        if ex.note:
            self.send(ex.rid, R_ERR, f"cwsandbox: {ex.note}\n".encode())
        timed_out = bool(flags & D_TIMED_OUT) or ex.backstopped
        ours = ex.backstopped or bool(ex.note)
        oom_killed = False
        count = self.oom.read() if self.oom.enabled else 0
        if count > ex.oom_before and not ours:
            oom_killed = bool(flags & D_UNEXPLAINED_KILL) or not ex.overlapped
        done = {
            "rc": rc,
            "w": round(time.monotonic() - ex.start, 6),
            "u": round(cpu, 6),
            "to": timed_out,
            "tr": ex.truncated,
            "oom": oom_killed,
            "cx": bool(flags & D_CPU_EXCEEDED),
            "cw": wait,
            "sc": ex.sandbox_cpu,
        }
        self.send(ex.rid, R_DONE, pack_meta(done))

    def send(self, rid: int, ftype: int, payload: bytes = b"") -> None:  # pragma: no cover - server.Agent's
        raise NotImplementedError

    def fail(self, rid: int, kind: str, message: str) -> None:  # pragma: no cover - server.Agent's
        raise NotImplementedError
