"""What /proc says about processes and this machine: memory (PSS/USS/RSS), trees, fds, threads.

Linux only; every reader returns an empty/None value for a process that is gone
(a benchmark samples live processes that may exit under it).
"""

from __future__ import annotations

import os
import resource
from collections.abc import Iterable
from dataclasses import dataclass, field

#: smaps_rollup fields summed (kB each).
FIELDS = ("Rss", "Pss", "Pss_Anon", "Pss_File", "Private_Clean", "Private_Dirty", "Shared_Clean", "Shared_Dirty")


def rollup(pid: int) -> dict[str, int]:
    """``/proc/<pid>/smaps_rollup`` in kB (empty if the process is gone or unreadable)."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                parts = line.split()
                if len(parts) == 3 and parts[2] == "kB":
                    out[parts[0].rstrip(":")] = int(parts[1])
    except OSError:
        return {}
    return out


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks (tells a live process from a reused pid)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return int(data[data.rfind(b")") + 2 :].split()[19])


def children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return kids
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids.extend(int(x) for x in f.read().split())
        except OSError:
            continue
    return kids


def tree(root: int) -> list[tuple[int, int]]:
    """``(pid, depth)`` of ``root`` and every descendant, root first."""
    out: list[tuple[int, int]] = []
    stack = [(root, 0)]
    while stack:
        pid, depth = stack.pop()
        out.append((pid, depth))
        stack.extend((kid, depth + 1) for kid in children(pid))
    return out


def comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


@dataclass
class MemTotals:
    """Summed smaps_rollup fields (kB) over a set of processes, overall and by tree depth."""

    processes: int = 0
    kb: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FIELDS, 0))
    by_depth: dict[int, dict[str, int]] = field(default_factory=dict)
    names: dict[int, set[str]] = field(default_factory=dict)

    def add(self, pid: int, depth: int = 0) -> None:
        r = rollup(pid)
        if not r:
            return
        self.processes += 1
        level = self.by_depth.setdefault(depth, {"processes": 0, **dict.fromkeys(FIELDS, 0)})
        level["processes"] += 1
        for key in FIELDS:
            self.kb[key] += r.get(key, 0)
            level[key] += r.get(key, 0)
        self.names.setdefault(depth, set()).add(comm(pid))

    def per(self, n: int) -> dict[str, float]:
        """MiB per unit (``n`` sandboxes) of PSS, USS (private) and RSS, plus the raw sums."""
        mib = 1024.0 * max(n, 1)
        return {
            "pss_mib": round(self.kb["Pss"] / mib, 3),
            "pss_anon_mib": round(self.kb["Pss_Anon"] / mib, 3),
            "uss_mib": round((self.kb["Private_Clean"] + self.kb["Private_Dirty"]) / mib, 3),
            "rss_mib": round(self.kb["Rss"] / mib, 3),
            "processes": round(self.processes / max(n, 1), 3),
        }


def measure_trees(roots: Iterable[int]) -> MemTotals:
    totals = MemTotals()
    for root in roots:
        for pid, depth in tree(root):
            totals.add(pid, depth)
    return totals


def meminfo() -> dict[str, int]:
    """``/proc/meminfo`` in kB."""
    out: dict[str, int] = {}
    with open("/proc/meminfo") as f:
        for line in f:
            name, _, rest = line.partition(":")
            out[name] = int(rest.split()[0])
    return out


def self_rss_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def thread_count() -> int:
    return len(os.listdir("/proc/self/task"))


def raise_nofile() -> tuple[int, int]:
    """Raise this process's RLIMIT_NOFILE soft limit to the hard limit; returns (soft, hard)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def limits() -> dict[str, int | str]:
    """The limits a thousand sandboxes run into first."""

    def read(path: str) -> str:
        try:
            with open(path) as f:
                return f.read().strip()
        except OSError:
            return "?"

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    return {
        "nofile_soft": soft,
        "nofile_hard": hard,
        "nproc_soft": nproc,
        "pid_max": int(read("/proc/sys/kernel/pid_max")),
        "threads_max": int(read("/proc/sys/kernel/threads-max")),
        "max_user_namespaces": read("/proc/sys/user/max_user_namespaces"),
        "max_net_namespaces": read("/proc/sys/user/max_net_namespaces"),
        "mem_total_mib": meminfo()["MemTotal"] // 1024,
    }
