"""OOM kills as the memory cgroup counts them (stdlib only).

The driver tells the agent which files count OOM kills for the cgroup its
commands run in (``config["oom_files"]``, paths as seen inside the sandbox,
where ``/sys`` is bound read-only): cgroup v2 ``memory.events`` and v1
``memory.oom_control`` have an ``oom_kill N`` line (v1 since Linux 4.13); v1
``memory.failcnt`` (times the limit was hit) is the fallback where that line is
missing. ``Counter.read`` sums what it finds; a file that cannot be read counts 0.

How the agent attributes a rise to an exec is described in ``server``.
"""

from __future__ import annotations


class Counter:
    """Reads the OOM-kill count of the commands' cgroup; ``enabled`` is False without files."""

    __slots__ = ("files",)

    def __init__(self, files: list[str] | None) -> None:
        self.files = [str(f) for f in files or ()]

    @property
    def enabled(self) -> bool:
        return bool(self.files)

    def read(self) -> int:
        total = 0
        for path in self.files:
            try:
                with open(path, "rb") as f:
                    text = f.read().decode("ascii", "replace")
            except OSError:
                continue
            if path.endswith("failcnt"):
                total += int(text.strip() or 0)
                continue
            for line in text.splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and value.strip().isdigit():
                    total += int(value)
        return total
