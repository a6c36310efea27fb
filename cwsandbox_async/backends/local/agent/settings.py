"""The agent's settings: every timeout and interval PID 1 uses, documented, with its default.

The driver passes overrides in the agent's configuration (``config["settings"]``); unknown names
and values that are not positive numbers are refused at start (``ValueError``), so a typo cannot
silently fall back to a default.

=====================  =======  ===============================================================
name                   default  meaning
=====================  =======  ===============================================================
``sample_interval``    0.25 s   how often PID 1 samples a running command's process tree (CPU
                                time for the budget, run-queue wait); once more at its end
``leftover_grace``     1.0 s    after a command ended, how long PID 1 waits for the processes
                                it left (killed at once) to be gone before it reports anyway
``exclusive_wait``     5.0 s    an exclusive exec waits at most this for the sandbox's other
                                processes to die, then fails
``sandbox_cpu_delay``  0.05 s   without a cgroup usage file, the sandbox's CPU at an exec's start
                                is read this long after it (``proctree.SandboxCpu``)
=====================  =======  ===============================================================
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

DEFAULTS: dict[str, float] = {
    "sample_interval": 0.25,
    "leftover_grace": 1.0,
    "exclusive_wait": 5.0,
    "sandbox_cpu_delay": 0.05,
}


class Settings:
    """Resolved settings; attribute names are the keys of ``DEFAULTS``."""

    __slots__ = tuple(DEFAULTS)

    sample_interval: float
    leftover_grace: float
    exclusive_wait: float
    sandbox_cpu_delay: float

    def __init__(self, overrides: dict[str, Any] | None = None) -> None:
        values: dict[str, Any] = dict(DEFAULTS)
        for name, value in (overrides or {}).items():
            if name not in DEFAULTS:
                raise ValueError(f"unknown agent setting {name!r}")
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"agent setting {name} must be a positive number, not {value!r}")
            values[name] = value
        for name, value in values.items():
            setattr(self, name, float(value))
