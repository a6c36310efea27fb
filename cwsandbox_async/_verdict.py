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
  (``min(1, resources.cpu)`` cores). A program that sleeps has no run-queue wait;
  one whose own processes (children, daemons it left, other execs in its sandbox)
  compete with it uses its share; a backend that cannot measure both the wait and
  the sandbox's CPU never reports starvation (no evidence: the program's timeout).
  Both thresholds are ``SandboxDefaults`` settings.
"""

from __future__ import annotations

from ._errors import SandboxTimeoutError
from ._types import ExecExit, ExecRequest, ExecResult, SandboxDefaults

__all__ = ["exec_result", "is_starved", "timeout_error"]


def is_starved(ex: ExecExit, defaults: SandboxDefaults) -> bool:
    """Whether a timed-out exec was starved of CPU by others (see the module docstring)."""
    wait, sandbox_cpu, wall = ex.cpu_wait_seconds, ex.sandbox_cpu_seconds, ex.wall_seconds
    if not ex.timed_out or wait is None or sandbox_cpu is None or wall <= 0:
        return False
    cores = defaults.resources.cpu
    entitled = 1.0 if cores is None else min(1.0, cores)
    used = max(ex.cpu_seconds, sandbox_cpu)
    return used < defaults.starved_cpu_share * entitled * wall and wait >= defaults.starved_wait_share * wall


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
