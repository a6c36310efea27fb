"""CPU priority for one exec (``ExecRequest.cpu_priority``): its sandbox's CPU weight, raised while it runs.

Every sandbox has its own CPU group (``_cgroup``: ``S``, holding ``S/agent`` and ``S/cmd``), a sibling
of every other sandbox's under the backend's parent group, where the driver's own processes (and
whatever else runs in that group: a trainer, the host's busy loops of a test) are tasks of weight 100
each (nice 0). For an exec that asks for priority the driver writes ``PRIORITY_CPU_WEIGHT`` (10,000,
100 times the default) into ``S``'s weight, and the usual weight back when the exec ends, however it
ends (its report, an error, the caller's cancellation or deadline). The kernel then gives ``S`` the CPU
before the others in proportion: on this 2-core machine, with 4 host busy loops and 12 other busy
sandboxes, a priority loop got 3.0 s of CPU in 3.3 s of wall time, against 21.7 s without.

Out of the program's reach: only the driver writes the file (the groups are the driver's, ``/sys`` is
read-only inside the sandbox, and when the driver is root the sandbox runs as another host uid).
What the priority can give is bounded by the request: it is granted only to an exclusive exec with a
``cpu_seconds`` budget (``validate_exec``), so nothing else of the sandbox runs with it and the command
takes at most its budget of CPU with it. Execs of one sandbox that overlap share one raise: the weight
goes back when the last of them ends.

Where it does not reach: the weight only orders the groups under the same parent. Processes outside
that parent (another cgroup of the machine, e.g. when the driver was given ``cgroup_parent`` or its
CI job is one of many groups) are not ordered by it: the parent group's own share decides there.
Without a CPU group (cgroups off, no writable cpu controller: an ordinary user on cgroup v1, a v2
group whose controllers are not delegated) there is no priority: the exec runs at its usual share,
an INFO line says so, and the verdict stays what the sandbox measured (a retry starved again is
``starved``, never a score it did not earn).

The writes run on the event loop, not in a worker thread (``_threads``): each is one write of a few
bytes to a cgroup control file, which the kernel does in memory, and the one that takes the priority
back must happen even when the exec's caller was cancelled, with no thread to wait for.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ..._log import log
from ._cgroup import SandboxCgroup

__all__ = ["cpu_priority"]


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


@contextmanager
def cpu_priority(cgroup: SandboxCgroup | None, wanted: bool, sandbox_id: str) -> Iterator[bool]:
    """Hold the sandbox's CPU priority for the block when ``wanted`` (see the module docstring).

    Yields whether the sandbox has it. Never raises for the weight itself: a weight that cannot be
    raised is logged (INFO) and the block runs at the usual share; one that cannot be lowered again is
    logged at ERROR (the sandbox keeps the priority until it is destroyed; its next exec that asks
    tries again)."""
    if not wanted:
        yield False
        return
    if cgroup is None or cgroup.weight_file is None:
        log.info("cpu priority unavailable: the sandbox has no cpu cgroup", sandbox_id=sandbox_id)
        yield False
        return
    if cgroup.priority_holders == 0:
        try:
            _write(cgroup.weight_file, cgroup.weight_priority)
        except OSError as exc:
            log.info("cpu priority not given", sandbox_id=sandbox_id, file=cgroup.weight_file, error=str(exc))
            yield False
            return
    cgroup.priority_holders += 1
    try:
        yield True
    finally:
        cgroup.priority_holders -= 1
        if cgroup.priority_holders == 0:
            try:
                _write(cgroup.weight_file, cgroup.weight_usual)
            except FileNotFoundError:
                pass  # the sandbox was destroyed meanwhile: its group is gone, and its weight with it
            except OSError as exc:
                log.error("cpu priority not taken back", sandbox_id=sandbox_id, file=cgroup.weight_file, error=str(exc))
