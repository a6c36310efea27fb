"""Process trees under ``/proc``: finding, killing and measuring a command's processes (stdlib only).

``TreeSampler`` measures what a verdict needs about a running command:

- **CPU time** of the whole tree while it runs: for every live or zombie process
  of the tree, its own and its reaped children's time from ``/proc/PID/stat``
  (clock-tick resolution, 10 ms). The exact figure at the end comes from
  ``wait4`` (the command's and every leftover's rusage, see ``execs``).
- **Run-queue wait** (``cpu_wait``): from ``/proc/PID/task/TID/schedstat``, the
  time each task of the tree spent runnable but not running, as last seen (a
  task that exits between two samples loses at most one interval), counted as
  wall time: the wait the tree's tasks gained between two samples counts at most
  the time between them. Tasks that wait together waited once: 30 processes of
  a program queued at its start for a tenth of a second waited a tenth of a
  second, not three (a sum over tasks would exceed the wall time of a program
  that then sleeps, and make its own timeout look starved). Two
  corrections keep a program from manufacturing "starvation":

  * tasks that lowered their own priority (nice above PID 1's, or a
    ``SCHED_BATCH``/``SCHED_IDLE`` policy) or narrowed the CPUs they may run on
    (an affinity smaller than PID 1's: 32 processes pinned to one CPU wait for
    each other) are not counted: they asked to wait;
  * the total is capped by the CPU capacity the tree left unused,
    ``cpus * wall - cpu``: a program whose own busy children queue behind each
    other while the tree keeps every CPU it may use busy was not starved by
    anyone else, so it reports (close to) no wait; a program that merely sleeps
    is not runnable, so it reports none either.
"""

from __future__ import annotations

import errno
import os
import signal
import time

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
SCHED_OTHER = 0


def kill_quietly(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass


#: Errors that mean "that process (or thread) is gone": anything else means /proc could not be read.
_GONE = (errno.ENOENT, errno.ESRCH)


class Unreadable(OSError):
    """``/proc`` could not be read (no descriptor left, no memory...): the tree is unknown, not empty.

    Whoever kills on such a reading must kill through the cgroup instead (fail closed)."""


def _unreadable(exc: OSError) -> Unreadable:
    return Unreadable(exc.errno, f"cannot read /proc: {exc.strerror}")


def children_of(pid: int) -> list[int]:
    """Direct children of ``pid``, through every one of its threads (empty when it is gone).

    ``Unreadable`` when ``/proc`` itself cannot be read (not when the process is gone)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError as exc:
        if exc.errno in _GONE:
            return []
        raise _unreadable(exc) from exc
    kids: list[int] = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                kids.extend(int(x) for x in f.read().split())
        except OSError as exc:
            if exc.errno in _GONE:
                continue
            raise _unreadable(exc) from exc
    return kids


def own_children() -> list[int]:
    """Children of this single-threaded process (one read of its main thread's ``children``).

    ``Unreadable`` when it cannot be read."""
    me = os.getpid()
    try:
        with open(f"/proc/{me}/task/{me}/children", "rb") as f:
            return [int(x) for x in f.read().split()]
    except OSError as exc:
        raise _unreadable(exc) from exc


def descendants(root: int) -> list[int]:
    """Every process below ``root`` (not ``root`` itself), parents before children."""
    out: list[int] = []
    todo = children_of(root)
    seen = set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        out.append(pid)
        todo.extend(children_of(pid))
    return out


def stat_fields(pid: int, tid: int | None = None) -> list[bytes] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state first), or None when gone."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rfind(b")") + 2 :].split()


def started_at(pid: int) -> float | None:
    """When the kernel recorded ``pid``'s birth, on ``time.monotonic``'s clock, rounded down to a clock
    tick; None when unreadable. The kernel stamps it late in ``fork``, after the cgroup checks, so a
    fork held there (a cgroup lock) is not in it."""
    fields = stat_fields(pid)
    if fields is None or len(fields) < 20:
        return None
    boot_offset = time.clock_gettime(time.CLOCK_BOOTTIME) - time.monotonic()  # the time suspended
    return int(fields[19]) / CLK_TCK - boot_offset


def state(pid: int) -> str | None:
    """One-letter process state (``R``, ``S``, ``T``, ``Z``, ...), or None when the process is gone."""
    fields = stat_fields(pid)
    return fields[0].decode() if fields else None


def kill_tree(root: int) -> None:
    """SIGKILL ``root``'s process group, ``root`` and every process below it (parents first).

    ``Unreadable`` (after the group and ``root`` were killed) when the tree could not be listed."""
    kill_quietly(-root, signal.SIGKILL)
    kill_quietly(root, signal.SIGKILL)
    for pid in descendants(root):
        kill_quietly(pid, signal.SIGKILL)


def kill_everything() -> bool:
    """Fail closed: SIGKILL every other process of the sandbox, without reading ``/proc``.

    As PID 1 of the sandbox's pid namespace, one ``kill(-1, SIGKILL)`` reaches every process in it
    (every command, leftover and file helper: each is in that namespace and runs as the same user)
    and never PID 1 itself; it needs no descriptor, so it works when PID 1 cannot open one. False
    outside a namespace of its own (an agent on the host), where nothing is killed."""
    if os.getpid() != 1:
        return False
    kill_quietly(-1, signal.SIGKILL)
    return True


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    st = state(pid)
    return st is not None and st != "Z"


class SandboxCpu:
    """CPU time of everything in the sandbox so far, for ``sandbox_cpu_seconds``.

    From the sandbox's cgroup when the driver passed its usage file (``fd``: v1
    ``cpuacct.usage`` in ns, v2 ``cpu.stat``'s ``usage_usec``): one exact read. Else,
    when the agent is PID 1 of the sandbox's own PID namespace (so ``/proc`` lists the
    sandbox's processes and nothing else): its own time, what it reaped, and every
    other process's own and reaped children's time -- each CPU-second is in exactly
    one of those places (a process reaped between two reads can count twice: an
    overestimate, which never makes a timeout look starved). One directory listing
    and one read per process, clock-tick resolution -- hundreds of microseconds
    here, so the agent takes that start reading ``sandbox_cpu_delay`` after an
    exec started (``exact`` is False) and adds the most the sandbox could have used
    meanwhile: again an overestimate, and an exec shorter than that costs nothing.
    Otherwise (an agent on the host) ``read`` is None: no figure is better than a
    wrong one.
    """

    __slots__ = ("fd", "own_ns")

    def __init__(self, fd: int | None = None) -> None:
        self.fd = fd
        self.own_ns = os.getpid() == 1

    @property
    def exact(self) -> bool:
        """Reading is one cheap, exact read (the cgroup's file), so take it right at an exec's start."""
        return self.fd is not None

    def read(self) -> float | None:
        if self.fd is not None:
            try:
                text = os.pread(self.fd, 4096, 0).decode("ascii", "replace")
            except OSError:
                return None
            for line in text.splitlines():
                if line.startswith("usage_usec "):
                    return int(line.split()[1]) / 1e6
            return int(text) / 1e9 if text.strip().isdigit() else None
        if not self.own_ns:
            return None
        me = os.times()
        ticks = 0
        try:
            names = os.listdir("/proc")
        except OSError:
            return None
        for name in names:
            if name.isdigit() and name != "1":
                fields = stat_fields(int(name))
                if fields is not None and len(fields) > 14:
                    ticks += int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
        return me.user + me.system + me.children_user + me.children_system + ticks / CLK_TCK


class TreeSampler:
    """Samples the tree of ``root`` (a command, a subreaper: its whole tree is below it); see the module docstring."""

    __slots__ = ("affinity", "cpus", "held", "last", "live_cpu", "nice", "root", "sampled", "total", "wait")

    def __init__(self, root: int, cpus: float, nice: int, affinity: int, start: float) -> None:
        self.root = root
        self.cpus = cpus
        self.nice = nice  # PID 1's: a task above it lowered its own priority
        self.affinity = affinity  # how many CPUs PID 1 may use: a task with fewer narrowed its own
        self.wait: dict[int, int] = {}  # tid -> run-queue wait (ns) last seen
        self.total = 0  # their sum at the last sample (ns)
        self.held = 0.0  # the tree's wait as wall time (s): each interval's gain, at most its length
        self.last = start  # ``time.monotonic()`` of the last sample (the exec's start before the first)
        self.live_cpu = 0.0
        self.sampled = False

    def sample(self, now: float) -> None:
        """Read the tree's CPU time and every counted task's wait (``root`` included, even as a zombie);
        ``now`` is ``time.monotonic()``, taken just before."""
        self.sampled = True
        ticks = 0
        try:
            tree = descendants(self.root)
        except Unreadable:  # the figures stay as last seen; the cgroup's count the CPU (``execs``)
            return
        for pid in (self.root, *tree):
            fields = stat_fields(pid)
            if fields is None or len(fields) < 39:
                continue
            ticks += int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for name in tids:
                tid = int(name)
                tfields = fields if tid == pid else stat_fields(pid, tid)
                if tfields is None or len(tfields) < 39:
                    continue
                if int(tfields[16]) > self.nice or int(tfields[38]) != SCHED_OTHER or self._pinned(tid):
                    self.wait.pop(tid, None)  # it asked to wait: none of its waiting counts
                    continue
                try:
                    with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                        self.wait[tid] = int(f.read().split()[1])
                except (OSError, IndexError, ValueError):
                    continue
        self.live_cpu = ticks / CLK_TCK
        total = sum(self.wait.values())
        # A task dropped for lowering its priority takes its wait with it: the gain is then smaller than
        # what the others gained, never larger.
        self.held += min(max(0, total - self.total) / 1e9, max(0.0, now - self.last))
        self.total, self.last = total, now

    def _pinned(self, tid: int) -> bool:
        if not self.affinity:
            return False
        try:
            return len(os.sched_getaffinity(tid)) < self.affinity
        except OSError:  # gone: its last figure stands
            return False

    def cpu(self) -> float:
        """CPU seconds of the tree at the last sample (every process's own and reaped children's time)."""
        return self.live_cpu

    def cpu_wait(self, wall: float, cpu: float) -> float | None:
        """Run-queue wait in seconds, capped by the capacity the tree left unused (module docstring);
        None when the tree was never sampled (a command that ended within one sample interval)."""
        if not self.sampled:
            return None
        return round(max(0.0, min(self.held, wall, self.cpus * wall - cpu)), 6)
