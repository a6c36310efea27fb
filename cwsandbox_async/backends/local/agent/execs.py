"""PID 1's execs: started, watched, ended and reported (stdlib only; the loop around them is ``init``).

Life of an exec: an ``O_RUN`` order arrives with its fds; ``begin`` starts its process and closes
PID 1's copies at once: a command or a file operation through the native spawner when the sandbox has
one (``spawn``: a ``posix_spawn``, no copy of PID 1), otherwise, and for Python programs, a fork
(the child, ``child``, reads the request and becomes the command or runs the program). PID 1 then watches
the clock: at the timeout, or once the CPU budget is spent (the tree is sampled every
``sample_interval``), it kills the command's process group and every process below it (the command
is a subreaper: nothing it started can leave its tree). When the command is reaped, what it left
behind is now PID 1's child: those *leftovers* are killed at once, their CPU (``wait4``) is added to
the exec's, and once none is alive (or ``leftover_grace`` passed) the exec is reported. File
operations are execs of a helper that starts nothing: no sampling, no leftovers, no OOM facts.

How its facts are decided:

- **timed out**: PID 1 killed it at its deadline, or it ended past it (checked where it ends); the
  clock (its wall time and deadline) starts when the fork or spawn has returned, so a start the
  kernel held up is not the program's time;
- **CPU budget exceeded** likewise, from the samples, or from the CPU time at the end, or the
  command died of ``SIGXCPU`` under the sandbox's ``RLIMIT_CPU`` (the kernel's verdict, taken as it
  is: it counts whole clock ticks, not the exact runtime reported, see ``rlimit_cpu_killed``). An exec's
  CPU time is the larger of its tree's (sampled, then ``wait4`` of the command and its leftovers)
  and, while no other exec ran beside it, the sandbox cgroup's usage over its life minus PID 1's
  own: that counts every process the exec made, reaped or not (children of a command that set
  ``SIGCHLD`` to ``SIG_IGN`` are reaped by the kernel and leave no rusage anywhere);
- **OOM-killed**: the commands' cgroup counted an OOM kill while it ran, and either the command
  itself died of a SIGKILL PID 1 did not send, or no other exec ran at any moment of its life
  (then the victim was one of its processes: the OOM killer prefers the processes with the highest
  ``oom_score_adj``, and every command has 1000). When execs overlap and the victim is not the
  command itself, none of them is marked: a kill that cannot be attributed is nobody's;
- **killed by the sandbox** (``note``): an exclusive exec killed it; the driver writes why on its
  stderr. An exclusive exec starts only once every other process of the sandbox is gone, and
  nothing else starts until it ended (file operations excepted);
- a file helper that something stopped (``SIGSTOP``, seen with ``WSTOPPED``) is killed at once,
  so no process of the sandbox can hold a file operation up (the seccomp filter refuses every stop
  signal, so this only happens in a sandbox without it).
"""

from __future__ import annotations

import collections
import errno
import os
import signal
import time

from . import child, proctree, protocol
from .protocol import R_DONE, R_FAIL, REPORT, RID_MASK

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from .oom import Counter
    from .settings import Settings

#: While an exclusive exec waits for the sandbox to clear, or leftovers are being killed, PID 1 looks
#: again this often (processes re-parented to it send no signal).
CLEAR_POLL = 0.005
#: A start (fork or spawn) that took longer than this, as PID 1 saw it, is dated by the kernel's birth
#: stamp of the process (``proctree.started_at``): PID 1's own stamp after the fork can be late by as
#: long as PID 1 waited for a CPU (or, outside a sandbox, was stopped) while its child already ran.
START_SLACK = 0.005
_FILE_MODES = (protocol.M_READ, protocol.M_WRITE)


class Exec:
    """One order, from its arrival to its report."""

    __slots__ = (
        "budget",
        "clear_until",
        "cpu",
        "cpu_exceeded",
        "deadline",
        "end",
        "fds",
        "flags",
        "killed",
        "leftover_deadline",
        "mode",
        "next_sample",
        "note",
        "oom_before",
        "overlapped",
        "own_cpu",
        "pid",
        "rid",
        "sampler",
        "sandbox_cpu",
        "sandbox_cpu_at",
        "start",
        "status",
        "timed_out",
        "timeout",
    )

    def __init__(self, rid: int, mode: int, flags: int, timeout: float, budget: float, fds: list[int]) -> None:
        self.rid, self.mode, self.flags, self.fds = rid, mode, flags, fds
        self.timeout = timeout if timeout > 0 else 0.0
        self.budget = budget if budget > 0 else 0.0
        self.pid = 0
        self.start = self.end = 0.0
        self.deadline = self.next_sample = self.leftover_deadline = float("inf")
        self.status: int | None = None
        self.cpu = 0.0
        self.timed_out = self.cpu_exceeded = self.killed = self.overlapped = False
        self.note = protocol.N_NONE
        self.oom_before = 0
        self.sampler: proctree.TreeSampler | None = None
        self.sandbox_cpu: float | None = None  # the sandbox's CPU at (about) its start
        self.own_cpu = 0.0  # PID 1's own CPU then
        self.sandbox_cpu_at: float | None = None  # when that reading is due or was taken
        self.clear_until: float | None = None  # exclusive: give up clearing the sandbox then

    @property
    def is_file(self) -> bool:
        return self.mode in _FILE_MODES

    @property
    def exclusive(self) -> bool:
        return bool(self.flags & protocol.F_EXCLUSIVE) and not self.is_file

    def close_fds(self) -> None:
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = []


class Execs:
    """Every exec of the sandbox (see the module docstring). ``send(rid, report)`` writes one report to the
    channel the order came from (``init``: an exec's ``rid`` is its channel's number above bit 32 and the
    driver's request id below)."""

    def __init__(
        self,
        config: dict[str, Any],
        settings: Settings,
        cpus: float,
        joins: list[int],
        oom: Counter,
        sandbox_cpu: proctree.SandboxCpu,
        send: Callable[[int, bytes], None],
    ) -> None:
        self.config, self.settings, self.cpus, self.joins = config, settings, cpus, joins
        self.oom, self.sandbox_cpu, self.send = oom, sandbox_cpu, send
        self.nice = os.getpriority(os.PRIO_PROCESS, 0)
        self.affinity = len(os.sched_getaffinity(0))
        self.execs: dict[int, Exec] = {}  # by request id
        self.by_pid: dict[int, Exec] = {}  # started and not reaped
        self.queue: collections.deque[Exec] = collections.deque()
        self.ending: list[Exec] = []  # reaped, leftovers being killed
        self.orphans: dict[int, Exec] = {}  # leftover pid -> the exec it came from
        self.exclusive: Exec | None = None  # the exclusive exec running, if any
        #: The native spawner's path inside the sandbox ("": none, every command forks PID 1).
        self.spawner: str = str(config.get("spawner") or "")

    # -- orders ----------------------------------------------------------------------------
    def submit(self, ex: Exec) -> None:
        want = 2 if ex.is_file else 3 + bool(ex.flags & protocol.F_STDIN)
        if ex.rid in self.execs or len(ex.fds) != want or ex.mode > protocol.M_WRITE:
            ex.close_fds()
            self.report(ex.rid, R_FAIL, protocol.N_BAD_ORDER)
            return
        self.execs[ex.rid] = ex
        if ex.is_file:
            self.begin(ex)
        else:
            self.queue.append(ex)
            self.schedule()

    def kill(self, rid: int) -> None:
        """The driver gave up on an exec (or its output hit the cap): kill its tree."""
        ex = self.execs.get(rid)
        if ex is None:
            return
        if ex.pid and ex.status is None:
            ex.killed = True
            self.kill_tree(ex.pid)
        elif ex in self.queue:
            self.queue.remove(ex)
            self.drop(ex, R_DONE, protocol.N_NONE, -signal.SIGKILL)
            self.schedule()

    def schedule(self) -> None:
        """Start queued execs in order; an exclusive one runs alone, once the sandbox is clear."""
        while self.queue and self.exclusive is None:
            ex = self.queue[0]
            if ex.exclusive and not self.clear_for(ex):
                if self.queue and self.queue[0] is ex:
                    return  # still clearing
                continue  # it gave up: the next one
            self.queue.popleft()
            self.begin(ex)
            if ex.exclusive and ex.pid:
                self.exclusive = ex

    def clear_for(self, ex: Exec) -> bool:
        """Kill every other exec's processes and every leftover; True once none is left."""
        now = time.monotonic()
        if ex.clear_until is None:
            ex.clear_until = now + self.settings.exclusive_wait
        busy = bool(self.ending)
        for other in list(self.by_pid.values()):
            if not other.is_file:
                busy = True
                other.note = other.note or protocol.N_EXCLUSIVE
                other.killed = True
                self.kill_tree(other.pid)
        if not self.kill_leftovers() and not busy:
            ex.clear_until = None
            return True
        if now >= ex.clear_until:
            self.queue.remove(ex)
            self.drop(ex, R_FAIL, protocol.N_NOT_CLEAR, 0)
        return False

    # -- starting ----------------------------------------------------------------------------
    def begin(self, ex: Exec) -> None:
        """Start the exec's process: the spawner for a command when there is one (``spawn``), else a fork
        (``child.start``); a failed start (the pids limit) is reported at once."""
        now = time.monotonic()
        if not ex.is_file:
            self.readings_at_start(ex, now)
        try:
            pid = self.spawn(ex) if self.spawner and ex.mode != protocol.M_PYTHON else 0
            if not pid:
                pid = os.fork()
                if pid == 0:
                    child.start(ex.mode, ex.fds, [] if ex.is_file else self.joins, self.config)
        except OSError:
            self.drop(ex, R_DONE, protocol.N_NO_PROCESS, protocol.SPAWN_FAILED)
            return
        ex.close_fds()
        # The exec's clock starts once its process exists: a fork can be held in the kernel for seconds
        # on a loaded machine (6.1 s seen: a cgroup lock behind a slow RCU grace period), the platform's
        # time, in no process of the exec's tree, so neither its wall nor its run-queue wait would show it.
        # Nor later than that: see ``START_SLACK``.
        start = time.monotonic()
        if start - now > START_SLACK:
            # Held in the fork, or PID 1 was not run after it while its child ran (a busy machine): the
            # kernel's birth stamp says which, to a tick. Never later than the process's birth, or a
            # command that ran while PID 1 waited would have that time off its clock and its timeout.
            born = proctree.started_at(pid)
            if born is not None:
                start = max(now, min(start, born + 1 / proctree.CLK_TCK))
        ex.pid, ex.start = pid, start
        self.by_pid[pid] = ex
        if not ex.is_file:
            ex.deadline = start + ex.timeout if ex.timeout else float("inf")
            ex.next_sample = start + self.settings.sample_interval

    def spawn(self, ex: Exec) -> int:
        """A command, or a file operation, through the native spawner (``spawn.c``): ``posix_spawn``, a vfork
        of PID 1 that copies nothing, of a program that does what ``child`` does for a command (or
        ``files`` for a file operation, ``cwspawn --file``: no CPython fork). The exec's fds and the
        cgroup fds are inheritable for this one spawn only. Its pid; 0 when the spawner itself
        cannot be run (it is given up and every exec forks from now on); ``OSError`` at a limit."""
        fds, limits = ex.fds, self.config.get("limits") or {}
        joins = () if ex.is_file else self.joins  # a file helper stays in PID 1's cgroups
        if ex.is_file:
            kind = "r" if ex.mode == protocol.M_READ else "w"
            limit = str(int(self.config.get("file_limit") or 0))
            argv = [self.spawner, "--file", kind, str(fds[0]), str(fds[1]), limit]
        else:
            stdin = fds[3] if len(fds) > 3 else -1
            argv = [
                self.spawner,
                "1" if self.config.get("die_with_parent") else "0",
                *(str(fd) for fd in (*fds[:3], stdin)),
                *(str(int(limits.get(name) or 0)) for name in ("cpu", "fsize", "nproc", "as")),
                *(str(fd) for fd in joins),
            ]
        passed = (*fds, *joins)
        spawned = False
        try:
            for fd in passed:
                os.set_inheritable(fd, True)
            pid = os.posix_spawn(self.spawner, argv, {})
            spawned = True
            return pid
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.ENOMEM):
                raise  # the pids limit, or memory: as a failed fork
            self.spawner = ""
            return 0
        finally:  # spawned: the exec's own fds are closed by the caller; else a fork's command must not get them
            for fd in joins if spawned else passed:
                os.set_inheritable(fd, False)

    def readings_at_start(self, ex: Exec, now: float) -> None:
        if self.oom.enabled:
            ex.oom_before = self.oom.read()
        if self.sandbox_cpu.exact:
            self.read_sandbox_cpu(ex, now)
        else:  # see proctree.SandboxCpu: read a little later, only for execs still running by then
            ex.sandbox_cpu_at = now + self.settings.sandbox_cpu_delay
        others = [e for e in self.by_pid.values() if not e.is_file]
        for e in (ex, *others) if others else ():
            e.overlapped = True

    def read_sandbox_cpu(self, ex: Exec, now: float) -> None:
        value = self.sandbox_cpu.read()
        ex.sandbox_cpu, ex.sandbox_cpu_at = value, (now if value is not None else None)
        ex.own_cpu = _own_cpu()

    def cgroup_cpu(self, ex: Exec) -> float | None:
        """The exec's CPU from the sandbox's cgroup (module docstring); None when another exec ran
        beside it or there is no exact figure."""
        if ex.overlapped or not self.sandbox_cpu.exact or ex.sandbox_cpu is None:
            return None
        now = self.sandbox_cpu.read()
        if now is None:
            return None
        return max(0.0, now - ex.sandbox_cpu - (_own_cpu() - ex.own_cpu))

    # -- time ----------------------------------------------------------------------------------
    def next_deadline(self) -> float | None:
        times = [e.leftover_deadline for e in self.ending]
        for ex in self.by_pid.values():
            if not ex.is_file:
                times.append(ex.next_sample if ex.timed_out else min(ex.deadline, ex.next_sample))
                if ex.sandbox_cpu is None and ex.sandbox_cpu_at is not None:
                    times.append(ex.sandbox_cpu_at)
        if self.ending or (self.queue and self.queue[0].exclusive and self.exclusive is None):
            times.append(time.monotonic() + CLEAR_POLL)
        return min(times) if times else None

    def tick(self, now: float) -> None:
        for ex in list(self.by_pid.values()):
            if ex.is_file:
                continue
            if ex.sandbox_cpu is None and ex.sandbox_cpu_at is not None and now >= ex.sandbox_cpu_at:
                self.read_sandbox_cpu(ex, now)
            if not ex.timed_out and now >= ex.deadline:
                self.sample(ex, now)  # the tree as it was at the deadline
                ex.timed_out = True
                self.kill_tree(ex.pid)
            elif now >= ex.next_sample:
                self.sample(ex, now)
        for ex in [e for e in self.ending if now >= e.leftover_deadline]:
            self.ending.remove(ex)
            self.finish(ex)  # its leftovers are still being killed; they are nobody's now
        self.settle()

    def sample(self, ex: Exec, now: float) -> None:
        if ex.sampler is None:
            ex.sampler = proctree.TreeSampler(ex.pid, self.cpus, self.nice, self.affinity, ex.start)
        ex.sampler.sample(now)
        ex.next_sample = now + self.settings.sample_interval
        if ex.budget and not ex.cpu_exceeded:
            used = ex.sampler.cpu()
            if used < ex.budget:
                used = max(used, self.cgroup_cpu(ex) or 0.0)
            if used >= ex.budget:
                ex.cpu_exceeded = True
                self.kill_tree(ex.pid)

    # -- ending --------------------------------------------------------------------------------
    def reap(self) -> None:
        """Wait for every child that exited (or stopped: a stopped file helper is killed)."""
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WSTOPPED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                break
            if info is None:
                break
            pid = info.si_pid
            ex = self.by_pid.get(pid)
            if info.si_code in (os.CLD_STOPPED, os.CLD_TRAPPED):
                os.waitid(os.P_PID, pid, os.WSTOPPED | os.WNOHANG)  # consume the stop
                if ex is not None and ex.is_file:
                    ex.note = protocol.N_STOPPED
                    proctree.kill_quietly(pid, signal.SIGKILL)
                continue  # a stopped command is its own business: its timeout still holds
            if ex is not None and ex.sampler is not None:
                ex.sampler.sample(time.monotonic())  # a zombie now: its last figures are still readable
            try:
                _, status, usage = os.wait4(pid, os.WNOHANG)
            except ChildProcessError:
                continue
            cpu = usage.ru_utime + usage.ru_stime
            if ex is not None:
                self.ended(ex, status, cpu)
            else:  # a leftover: its CPU is the exec's it came from
                owner = self.orphans.pop(pid, None) or (self.ending[0] if self.ending else None)
                if owner is not None:
                    owner.cpu += cpu
        self.settle()

    def ended(self, ex: Exec, status: int, cpu: float) -> None:
        del self.by_pid[ex.pid]
        ex.status, ex.end = status, time.monotonic()
        ex.cpu += cpu
        if ex.is_file:
            self.finish(ex)
            return
        proctree.kill_quietly(-ex.pid, signal.SIGKILL)  # its process group, leader gone
        ex.leftover_deadline = ex.end + self.settings.leftover_grace
        self.ending.append(ex)

    def settle(self) -> None:
        """Kill leftovers; report the ended execs once none is alive; start what waited."""
        if self.ending and not self.kill_leftovers():
            ending, self.ending = self.ending, []
            for ex in ending:
                self.finish(ex)
        if self.queue:
            self.schedule()

    def kill_tree(self, root: int) -> None:
        """``proctree.kill_tree``, failing closed: when ``/proc`` cannot be read, kill everything."""
        try:
            proctree.kill_tree(root)
        except proctree.Unreadable:
            self.fail_closed()

    def fail_closed(self) -> None:
        """PID 1 cannot see the processes it must kill: every process of the sandbox dies (and each
        exec that was running is marked as killed by the sandbox)."""
        if proctree.kill_everything():
            for ex in self.by_pid.values():
                if not ex.is_file:
                    ex.killed = True

    def kill_leftovers(self) -> int:
        """Kill every child that is no exec's command (and everything below it); how many there were."""
        owner = self.ending[0] if self.ending else None
        left = 0
        try:
            children = proctree.own_children()
        except proctree.Unreadable:
            self.fail_closed()  # leftovers unknown: none is left once this returns
            return 0
        for pid in children:
            if pid not in self.by_pid:
                left += 1
                if owner is not None:
                    self.orphans.setdefault(pid, owner)
                self.kill_tree(pid)
        return left

    def finish(self, ex: Exec) -> None:
        del self.execs[ex.rid]
        if self.exclusive is ex:
            self.exclusive = None
        assert ex.status is not None
        rc = os.waitstatus_to_exitcode(ex.status)
        wall = ex.end - ex.start
        if not ex.is_file:
            ex.cpu = max(ex.cpu, self.cgroup_cpu(ex) or 0.0)
        flags = 0
        if ex.timed_out or (ex.timeout and wall >= ex.timeout):
            flags |= protocol.D_TIMED_OUT
        if ex.cpu_exceeded or (ex.budget and ex.cpu > ex.budget) or self.rlimit_cpu_killed(ex, rc):
            flags |= protocol.D_CPU_EXCEEDED
        if not ex.is_file and not ex.note and self.oom.enabled and self.oom.read() > ex.oom_before:
            unexplained = rc == -signal.SIGKILL and not (ex.killed or ex.timed_out or ex.cpu_exceeded)
            if unexplained or not ex.overlapped:
                flags |= protocol.D_OOM
        wait = ex.sampler.cpu_wait(wall, ex.cpu) if ex.sampler is not None else None
        sandbox = None
        if ex.sandbox_cpu is not None and ex.sandbox_cpu_at is not None:
            now_cpu = self.sandbox_cpu.read()
            if now_cpu is not None:  # plus what the sandbox could have used before a late start reading
                sandbox = now_cpu - ex.sandbox_cpu + max(0.0, ex.sandbox_cpu_at - ex.start) * self.cpus
        self.report(ex.rid, R_DONE, ex.note, rc, flags, wall, ex.cpu, wait, sandbox)

    def rlimit_cpu_killed(self, ex: Exec, rc: int) -> bool:
        """The command died of ``SIGXCPU`` while the sandbox sets ``RLIMIT_CPU``: the kernel ended it
        for its CPU time. Its own figure is not compared: the kernel checks the limit against the
        tick-sampled CPU clock (whole 4 ms ticks charged to whichever task is running at each), while
        ``cpu_seconds`` is the scheduler's exact runtime (``wait4``, the cgroup): under load the two
        part by tens of percent (a 1 s limit hit at 0.78 s of runtime), either way."""
        limits = self.config.get("limits") or {}
        return not ex.is_file and rc == -signal.SIGXCPU and bool(limits.get("cpu"))

    def drop(self, ex: Exec, kind: int, note: int, rc: int) -> None:
        """Report an exec that never started (its fds closed)."""
        ex.close_fds()
        self.execs.pop(ex.rid, None)
        self.report(ex.rid, kind, note, rc)

    def report(
        self,
        rid: int,
        kind: int,
        note: int,
        rc: int = 0,
        flags: int = 0,
        wall: float = 0.0,
        cpu: float = 0.0,
        wait: float | None = None,
        sandbox: float | None = None,
    ) -> None:
        waited = -1.0 if wait is None else wait
        # ``rid`` carries its channel above bit 32 (``init``): the report goes there, with the driver's own id.
        self.send(
            rid,
            REPORT.pack(kind, note, flags, rid & RID_MASK, rc, wall, cpu, waited, -1.0 if sandbox is None else sandbox),
        )

    def kill_all(self) -> None:
        """Every exec's tree and every leftover (PID 1 is going away)."""
        for ex in list(self.by_pid.values()):
            self.kill_tree(ex.pid)
        self.kill_leftovers()


def _own_cpu() -> float:
    """PID 1's own CPU time (not its children's)."""
    t = os.times()
    return t.user + t.system
