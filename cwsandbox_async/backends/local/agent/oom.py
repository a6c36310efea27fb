"""OOM kills as the memory cgroup counts them (stdlib only).

The driver tells the agent which file counts OOM kills for the cgroup its
commands run in: an open fd (``cmd_events``, when the driver passes fds) or paths
(``config["oom_files"]``, as seen inside the sandbox, where ``/sys`` is bound
read-only): cgroup v2 ``memory.events`` and v1
``memory.oom_control`` have an ``oom_kill N`` line (v1 since Linux 4.13); v1
``memory.failcnt`` (times the limit was hit) is the fallback where that line is
missing. ``Counter.read`` sums what it finds; a file that cannot be read counts 0.

How the agent attributes a rise to an exec is described in ``server``.
"""

from __future__ import annotations

import os


class Counter:
    """Reads the OOM-kill count of the commands' cgroup; ``enabled`` is False without files."""

    __slots__ = ("fd", "files")

    def __init__(self, files: list[str] | None, fd: int | None = None) -> None:
        self.files = [str(f) for f in files or ()]
        self.fd = fd

    @property
    def enabled(self) -> bool:
        return bool(self.files) or self.fd is not None

    def read(self) -> int:
        total = 0
        if self.fd is not None:
            try:
                total += _oom_kills(os.pread(self.fd, 4096, 0).decode("ascii", "replace"))
            except OSError:
                pass
        for path in self.files:
            try:
                with open(path, "rb") as f:
                    text = f.read().decode("ascii", "replace")
            except OSError:
                continue
            if path.endswith("failcnt"):
                total += int(text.strip() or 0)
                continue
            total += _oom_kills(text)
        return total


def _oom_kills(text: str) -> int:
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return 0
