"""Doctor probes for the birth path: what the template gives each sandbox, checked on real sandboxes.

Each probe starts from what a sandbox can see or do, or from what the host sees of it:

- **born from the template**: the sandbox's first process is a fork of the template (its parent
  on the host is the template), so it paid no interpreter start;
- **own host uid** (driver as root): two sandboxes run as two different unprivileged host uids;
- **own cgroups**: the host's ``/proc/<pid>/cgroup`` of the sandbox names its own cpu (always),
  pids and memory groups, and inside the cgroup namespace a command's and the agent's groups are
  ``/`` or below it (none above the namespace's root, which would show the host's layout);
- **agent outside the memory limit**: a command that allocates past ``memory_mib`` is killed and
  the next exec in the same sandbox still runs;
- **no nested user namespaces**: ``unshare(CLONE_NEWUSER)`` fails inside.
"""

from __future__ import annotations

import os
from typing import Any

from ..probes import FAIL, OK, SKIP, Status

__all__ = ["birth_probes"]

USERNS_PROBE = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
rc = libc.unshare(0x10000000)
print("created" if rc == 0 else f"refused {os.strerror(ctypes.get_errno())}")
"""


def _host(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _field(status: str, name: str) -> str:
    line = next((x for x in status.splitlines() if x.startswith(name + ":")), f"{name}: ?")
    return line.split()[1]


async def birth_probes(p: Any, backend: Any) -> None:
    """Add the birth-path checks to ``p.section`` (``p`` is the doctor's ``_Prober``)."""
    if not getattr(backend, "describe", None):
        return
    info = await backend.describe()
    if not info.get("template"):
        p.section.add("template", SKIP, f"no template on the {info.get('agent')} path", "describe the backend")
        return
    boxes: dict[str, Any] = getattr(backend, "_boxes", {})

    async def template() -> tuple[Status, str]:
        box = boxes[(await p.sandbox()).sandbox_id]
        parent = _field(_host(f"/proc/{box.pid}/status"), "PPid")
        t = backend._template
        children = _host(f"/proc/{t.pid}/task/{t.pid}/children").split() if t is not None and t.pid else []
        ok = parent in children
        return (OK if ok else FAIL), f"the sandbox's first process (host pid {box.pid}) is a child of the template"

    await p.check("born from the template", "the host's PPid of the sandbox's first process", template)

    async def uids() -> tuple[Status, str]:
        if os.geteuid() != 0:
            return SKIP, "the driver is not root: every sandbox runs as its uid"
        first = await p.sandbox()
        second = await p.session.sandbox()
        try:
            seen = [_field(_host(f"/proc/{boxes[sb.sandbox_id].pid}/status"), "Uid") for sb in (first, second)]
        finally:
            await second.stop()
        ok = seen[0] != seen[1] and "0" not in seen
        return (OK if ok else FAIL), f"two sandboxes run as host uids {seen[0]} and {seen[1]}"

    await p.check("own host uid per sandbox", "host uids of two sandboxes' first processes", uids)

    async def cgroups() -> tuple[Status, str]:
        sb = await p.sandbox()
        box = boxes[sb.sandbox_id]
        lines = _host(f"/proc/{box.pid}/cgroup").splitlines()
        own = {c for line in lines for c in line.split(":")[1].split(",") if sb.sandbox_id in line.split(":")[-1]}
        inside = await sb.exec("cat /proc/self/cgroup /proc/1/cgroup")  # a command's and the agent's
        if not backend._cgroups.available:
            return SKIP, "no writable cgroup controller here (limits are rlimits)"
        # Inside the cgroup namespace every group of the sandbox is its root or below it: a path that
        # climbs above the root ("/../cmd") shows the host's layout.
        above = sorted({x for x in inside.stdout.split() if x.split(":", 2)[-1].startswith("/..")})
        wanted = set(backend._cgroups.available) - {"memory"}  # the agent's memory group is the sandbox's too
        ok = wanted <= own and inside.returncode == 0 and not above
        seen = f"above the namespace root: {', '.join(above)}" if above else "inside, every group is / or below it"
        return (OK if ok else FAIL), f"own groups: {', '.join(sorted(own)) or 'none'}; {seen}"

    await p.check("own cgroups (cpu always)", "the host's /proc/<pid>/cgroup of the sandbox; inside", cgroups)

    async def agent_memory() -> tuple[Status, str]:
        sb = await p.sandbox()
        r = await sb.exec(["python3", "-c", "x = bytearray(1 << 30)"], timeout_seconds=30)
        after = await sb.exec(["echo", "alive"])
        ok = r.returncode != 0 and after.stdout == "alive\n"
        detail = f"a 1 GiB allocation ended with {r.returncode}; the next exec: {after.stdout.strip() or after.stderr}"
        return (OK if ok else FAIL), detail

    await p.check("agent outside the memory limit", "allocate 1 GiB past memory_mib, then exec again", agent_memory)

    async def userns() -> tuple[Status, str]:
        r = await (await p.sandbox()).exec(["python3", "-c", USERNS_PROBE])
        ok = r.stdout.startswith("refused")
        return (OK if ok else FAIL), f"unshare(CLONE_NEWUSER) inside: {r.stdout.strip() or r.stderr.strip()}"

    await p.check("no nested user namespaces", "unshare(CLONE_NEWUSER) from a command", userns)
