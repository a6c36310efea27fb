"""What an exec's end means: the program's own outcome, or the platform starving it of CPU.

The Sandbox layer calls ``exec_result`` on every ``ExecExit`` a backend returns
and raises ``timeout_error`` for a timed-out one. The rule (docs/outcomes.md):

- Everything the program did is a **result**: its exit code, its OOM kill
  (``oom_killed``), its CPU budget (``cpu_exceeded``), the output cap
  (``truncated``), and its own wall timeout: ``SandboxTimeoutError`` with
  ``infrastructure=False``.
- A wall timeout is **starved** (``ExecResult.starved``, and the timeout is
  infrastructure) only with evidence that the platform, not the program, used
  the time: the backend measured run-queue wait (``cpu_wait_seconds``, at least
  ``starved_wait_share`` of the wall time) **and** the command's process tree and
  everything else in its sandbox (``sandbox_cpu_seconds``) got less than
  ``starved_cpu_share`` of the CPU the sandbox was entitled to
  (``min(1, resources.cpu)`` cores) **and** something outside the sandbox held the
  machine's CPUs: ``others_cpu_seconds``, measured outside the sandbox, is at least
  ``OTHERS_SHARE`` of the capacity the sandbox left unused (``cpus * wall`` minus
  what it used, ``cpus`` the CPUs this process may run on). The first two are the
  program's own facts and a program can shape them (32 of its processes pinned to
  one CPU, waking together, wait for each other while using little); the third it
  cannot: its own tasks are in its cgroup and are subtracted. And the wait must be
  at least the time it spent neither running nor waiting for a CPU (``wall - used -
  wait``: asleep, or blocked on its own): a program that mostly sleeps still waits
  at its start and its wakeups, which on a loaded machine can be a quarter of a
  short timeout, but the platform did not take the time it slept. One whose own
  processes compete with it uses its share or leaves the machine idle; a backend that cannot measure all three never
  reports starvation (no evidence: the program's timeout). The first two
  thresholds are ``SandboxDefaults`` settings.
"""

from __future__ import annotations

import os
from contextvars import ContextVar

from ._errors import SandboxTimeoutError
from ._types import ExecExit, ExecRequest, ExecResult, SandboxDefaults

__all__ = [
    "LATE_VERDICT",
    "OTHERS_SHARE",
    "exec_result",
    "is_starved",
    "late_verdict",
    "others_held_the_machine",
    "timeout_error",
]

#: What a backend said of a call its deadline cut short (``_deadline.backend_call`` reads it):
#: True / False with or without outside evidence that the lateness was not the program's doing.
LATE_VERDICT: ContextVar[bool | None] = ContextVar("cwsandbox_async_late_verdict", default=None)


def late_verdict(infrastructure: bool) -> None:
    """Called by a backend inside ``backend_call`` as its deadline cuts a call short: whether it has
    evidence from outside the sandbox that the lateness was not the program's doing."""
    LATE_VERDICT.set(infrastructure)


#: The share of the capacity a starved sandbox left unused that others must have used.
OTHERS_SHARE = 0.75


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def others_held_the_machine(others: float, used: float, wall: float) -> bool:
    """Whether work outside a sandbox (``others`` CPU seconds over ``wall``) held at least
    ``OTHERS_SHARE`` of the capacity the sandbox (``used``) left; the evidence a starved exec and a
    late report both need."""
    return others >= OTHERS_SHARE * max(0.0, _cpus() * wall - used)


def is_starved(ex: ExecExit, defaults: SandboxDefaults) -> bool:
    """Whether a timed-out exec was starved of CPU by others (see the module docstring)."""
    wait, sandbox_cpu, wall = ex.cpu_wait_seconds, ex.sandbox_cpu_seconds, ex.wall_seconds
    others = ex.others_cpu_seconds
    if not ex.timed_out or wait is None or sandbox_cpu is None or others is None or wall <= 0:
        return False
    cores = defaults.resources.cpu
    entitled = 1.0 if cores is None else min(1.0, cores)
    used = max(ex.cpu_seconds, sandbox_cpu)
    if used >= defaults.starved_cpu_share * entitled * wall or wait < defaults.starved_wait_share * wall:
        return False
    if wait < wall - used - wait:  # it slept or blocked longer than it waited for a CPU: its own time
        return False
    return others_held_the_machine(others, used, wall)


def exec_result(req: ExecRequest, ex: ExecExit, sandbox_id: str, defaults: SandboxDefaults) -> ExecResult:
    """The ``ExecResult`` of ``ex``, with ``starved`` decided."""
    return ExecResult.from_exit(req.argv, ex, sandbox_id, starved=is_starved(ex, defaults))


def timeout_error(req: ExecRequest, result: ExecResult) -> SandboxTimeoutError:
    """The error a timed-out exec raises: the program's own timeout, or (starved) the platform's failure."""
    text = f"command timed out after {req.timeout_seconds:g} seconds"
    if result.starved:
        wait = result.cpu_wait_seconds or 0.0
        text += (
            f" while starved of CPU (it got {result.cpu_seconds:.2f} s of CPU and waited {wait:.2f} s for one);"
            " the machine is overloaded: lower the concurrency or raise the timeout"
        )
    return SandboxTimeoutError(text, sandbox_id=result.sandbox_id, result=result, infrastructure=result.starved)
