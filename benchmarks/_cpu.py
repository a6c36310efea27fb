"""CPU accounting for the benchmarks: cgroup v1 cpuacct groups of our own, per-process schedstat.

``AcctGroup`` makes a ``cpuacct`` group (v1) under the one this process is in and moves a process
into it; every process forked from it afterwards, and every sandbox cgroup the local backend creates
(it places them under the cgroup the driver is in), is counted in its ``cpuacct.usage``
(nanoseconds, hierarchical, kept after a child group is removed). Only the cpuacct hierarchy is
touched: scheduling (the ``cpu`` controller) is unchanged. ``None`` from ``AcctGroup.make`` where
there is no writable v1 cpuacct hierarchy (a v2-only host, no root).
"""

from __future__ import annotations

import contextlib
import os
import resource

ROOT = "/sys/fs/cgroup/cpuacct"


def _own_cpuacct() -> str | None:
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, ctrls, path = line.rstrip("\n").split(":", 2)
                if "cpuacct" in ctrls.split(","):
                    return path
    except OSError:
        return None
    return None


def read_ns(path: str) -> int:
    with open(path) as f:
        return int(f.read().split()[0])


def task_ns(pid: int) -> int:
    """CPU time (ns, ``schedstat``) of every live thread of ``pid``; 0 when it is gone."""
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    for tid in tids:
        with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{pid}/task/{tid}/schedstat") as f:
            total += int(f.read().split()[0])
    return total


def children_ns(pid: int) -> int:
    """``cutime + cstime`` of ``pid`` (its reaped descendants, cumulative) in ns (10 ms resolution)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return 0
    fields = data[data.rfind(b")") + 2 :].split()
    ticks = int(fields[13]) + int(fields[14])
    return ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def self_ns() -> int:
    """This process's CPU (every thread, not its children) in ns."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return int((r.ru_utime + r.ru_stime) * 1e9)


class AcctGroup:
    """One cpuacct group of ours (see the module docstring); ``remove`` when empty."""

    def __init__(self, path: str) -> None:
        self.path = path

    @classmethod
    def make(cls, name: str) -> AcctGroup | None:
        own = _own_cpuacct()
        if own is None or not os.path.isdir(ROOT):
            return None
        path = os.path.join(ROOT, own.lstrip("/"), name)
        try:
            os.makedirs(path, exist_ok=True)
        except OSError:
            return None
        return cls(path)

    def child(self, name: str) -> AcctGroup:
        path = os.path.join(self.path, name)
        os.makedirs(path, exist_ok=True)
        return AcctGroup(path)

    def join(self, pid: int) -> None:
        """Move every thread of ``pid`` in (``OSError`` if refused)."""
        with open(os.path.join(self.path, "cgroup.procs"), "w") as f:
            f.write(str(pid))

    def usage(self) -> int:
        return read_ns(os.path.join(self.path, "cpuacct.usage"))

    def remove(self) -> None:
        """Move whatever is still in this group (and its children) to its parent, then remove it (best effort)."""
        for sub in sorted((d for d, _, _ in os.walk(self.path)), key=len, reverse=True):
            with contextlib.suppress(OSError):
                with open(os.path.join(sub, "cgroup.procs")) as f:
                    pids = f.read().split()
                for pid in pids:
                    with open(os.path.join(os.path.dirname(self.path), "cgroup.procs"), "w") as out:
                        out.write(pid)
            with contextlib.suppress(OSError):
                os.rmdir(sub)
