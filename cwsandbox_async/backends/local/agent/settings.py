"""The agent's settings: every timeout and budget it uses, documented, with its default.

The driver passes overrides in the boot configuration (``config["settings"]``);
unknown names and values that are not positive numbers are refused at boot
(``ValueError``), so a typo cannot silently fall back to a default.

====================  =======  ================================================================
name                  default  meaning
====================  =======  ================================================================
``backstop``          1.0 s    past an exec's timeout, the agent kills its worker itself (a
                               command may have stopped it) and reports the exec as timed out
``eof_grace``         1.0 s    after a worker reported, how long the agent waits for the exec's
                               output pipes to close
``ack_timeout``       0.5 s    a worker acknowledges a request within this, or the agent checks
                               it (a stopped one is killed and the request goes to another)
``idle_trim``         5.0 s    without an exec for this long, idle workers beyond one retire
``max_idle_workers``  8        idle workers kept at most
``sample_interval``   0.25 s   how often a worker samples its command's process tree (CPU time
                               for the budget, run-queue wait); always once more at the end
``exclusive_wait``    5.0 s    an exclusive exec waits at most this for the sandbox's other
                               processes to die, then fails
``refill_pause``      1.0 s    after a failed worker spawn (pids limit), the next try waits this
``sandbox_cpu_delay``  0.05 s  without a cgroup usage file, the sandbox's CPU at an exec's start
                               is read this long after it (``proctree.SandboxCpu``)
``max_execs``         5000     a worker retires after this many execs
====================  =======  ================================================================
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

DEFAULTS: dict[str, float] = {
    "backstop": 1.0,
    "eof_grace": 1.0,
    "ack_timeout": 0.5,
    "idle_trim": 5.0,
    "max_idle_workers": 8,
    "sample_interval": 0.25,
    "exclusive_wait": 5.0,
    "refill_pause": 1.0,
    "sandbox_cpu_delay": 0.05,
    "max_execs": 5000,
}
_INTEGERS = ("max_idle_workers", "max_execs")


class Settings:
    """Resolved settings; attribute names are the keys of ``DEFAULTS``."""

    __slots__ = tuple(DEFAULTS)

    backstop: float
    eof_grace: float
    ack_timeout: float
    idle_trim: float
    max_idle_workers: int
    sample_interval: float
    exclusive_wait: float
    refill_pause: float
    sandbox_cpu_delay: float
    max_execs: int

    def __init__(self, overrides: dict[str, Any] | None = None) -> None:
        values: dict[str, Any] = dict(DEFAULTS)
        for name, value in (overrides or {}).items():
            if name not in DEFAULTS:
                raise ValueError(f"unknown agent setting {name!r}")
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"agent setting {name} must be a positive number, not {value!r}")
            values[name] = value
        for name, value in values.items():
            setattr(self, name, int(value) if name in _INTEGERS else float(value))
