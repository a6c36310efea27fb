"""Evidence from outside a sandbox that something else held the machine's CPUs during an exec.

A timed-out exec counts as starved (``_verdict``) only when the machine was busy with work that is
not the sandbox's own. The driver measures that itself, on the host, over the exec's window (from
posting its order to receiving its report): the host's busy time from ``/proc/stat`` (user, nice and
system time of every CPU, guests included, and steal time: CPU the hypervisor gave to other
machines) minus the sandbox cgroup's own usage (v1 ``cpuacct.usage``, v2 ``cpu.stat``
``usage_usec``). A sandbox can hardly raise that figure: every process it has is in its cgroup, and
the interrupt and soft-interrupt time its traffic causes is not counted (kernel threads working for
it are the one way left, and a small one). Its own tasks -- however many, pinned to one CPU and
waking together -- add to both sides and cancel out. (User time alone would be safer still, but it
misses the kernel work of a really overloaded machine: 16 sandboxes starting at once on 2 CPUs
spend about a third of it in the kernel.)

Two ``pread``s per reading on descriptors opened once; the end reading is taken only for execs that
timed out. Where the cgroup's usage cannot be read, there is no evidence (``None``), and no exec of
that sandbox is ever starved.
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["Evidence", "HostCpu", "SandboxCpu"]

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class HostCpu:
    """The host's busy user, nice, system and steal time, all CPUs, in seconds (one ``/proc/stat`` fd)."""

    def __init__(self) -> None:
        try:
            self.fd: int | None = os.open("/proc/stat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self.fd = None

    def read(self) -> float | None:
        if self.fd is None:
            return None
        try:
            head = os.pread(self.fd, 256, 0)
        except OSError:
            return None
        fields = head.split(b"\n", 1)[0].split()
        if len(fields) < 9 or fields[0] != b"cpu":
            return None
        user, nice, system, steal = int(fields[1]), int(fields[2]), int(fields[3]), int(fields[8])
        return (user + nice + system + steal) / _TICK

    def close(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None


class SandboxCpu:
    """CPU time of everything in one sandbox's cgroup, in seconds; ``None`` when unreadable."""

    def __init__(self, usage_path: str | None) -> None:
        """``usage_path``: the sandbox's v1 ``cpuacct.usage`` (ns) or v2 ``cpu.stat``."""
        self.fd: int | None = None
        self.v2 = bool(usage_path and usage_path.endswith("cpu.stat"))
        if usage_path:
            with contextlib.suppress(OSError):
                self.fd = os.open(usage_path, os.O_RDONLY | os.O_CLOEXEC)

    def read(self) -> float | None:
        if self.fd is None:
            return None
        try:
            text = os.pread(self.fd, 4096, 0)
        except OSError:
            return None
        if not self.v2:
            return int(text) / 1e9 if text.strip().isdigit() else None
        for line in text.splitlines():
            key, _, value = line.partition(b" ")
            if key == b"usage_usec" and value.strip().isdigit():
                return int(value) / 1e6
        return None

    def close(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None


class Evidence:
    """One sandbox's readings (see the module docstring); ``close`` releases both descriptors."""

    def __init__(self, usage_path: str | None) -> None:
        self.sandbox = SandboxCpu(usage_path)
        self.host = HostCpu() if self.sandbox.fd is not None else None

    def reading(self) -> tuple[float, float] | None:
        """(host busy, sandbox busy) now; ``None`` without both."""
        if self.host is None:
            return None
        busy = self.host.read()
        own = self.sandbox.read() if busy is not None else None
        return None if busy is None or own is None else (busy, own)

    @staticmethod
    def others(start: tuple[float, float] | None, end: tuple[float, float] | None) -> float | None:
        """CPU seconds the rest of the machine used between two readings (never below 0)."""
        if start is None or end is None:
            return None
        return round(max(0.0, (end[0] - start[0]) - (end[1] - start[1])), 6)

    def close(self) -> None:
        self.sandbox.close()
        if self.host is not None:
            self.host.close()
