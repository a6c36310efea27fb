"""Evidence from outside a sandbox that something else held the machine's CPUs during an exec.

A timed-out exec counts as starved (``_verdict``) only when the machine was busy with work that is
not the sandbox's own. The driver measures that itself, on the host, over the exec's window (from
posting its order to receiving its report): the host's busy time from ``/proc/stat`` (user and nice
time of every CPU, guests included, and steal time: CPU the hypervisor gave to other machines) minus
the sandbox cgroup's own user time (v1 ``cpuacct.usage_user``, v2 ``cpu.stat`` ``user_usec``).
Nothing inside a sandbox can raise that figure: every process it has is in its cgroup, and kernel
work it causes (interrupts, kernel threads) is system time, which is not counted. Its own tasks --
however many, pinned to one CPU and waking together -- add to both sides and cancel out.

Two ``pread``s per reading on descriptors opened once; the end reading is taken only for execs that
timed out. Where the cgroup's user time cannot be read, there is no evidence (``None``), and no
exec of that sandbox is ever starved.
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["Evidence", "HostCpu", "SandboxUserCpu"]

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class HostCpu:
    """The host's busy user, nice and steal time, all CPUs, in seconds (one ``/proc/stat`` descriptor)."""

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
        user, nice, steal = int(fields[1]), int(fields[2]), int(fields[8])
        return (user + nice + steal) / _TICK

    def close(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None


class SandboxUserCpu:
    """User CPU time of everything in one sandbox's cgroup, in seconds; ``None`` when unreadable."""

    def __init__(self, usage_path: str | None) -> None:
        """``usage_path``: the sandbox's v1 ``cpuacct.usage`` or v2 ``cpu.stat`` (its user time is next to it)."""
        self.fd: int | None = None
        self.v2 = bool(usage_path and usage_path.endswith("cpu.stat"))
        if usage_path:
            path = usage_path if self.v2 else os.path.join(os.path.dirname(usage_path), "cpuacct.usage_user")
            with contextlib.suppress(OSError):
                self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)

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
            if key == b"user_usec" and value.strip().isdigit():
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
        self.sandbox = SandboxUserCpu(usage_path)
        self.host = HostCpu() if self.sandbox.fd is not None else None

    def reading(self) -> tuple[float, float] | None:
        """(host busy, sandbox user) now; ``None`` without both."""
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
