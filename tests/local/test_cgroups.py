"""Per-sandbox cgroups from birth: a CPU group always, and the agent outside its commands' memory limit."""

from __future__ import annotations

import time

import anyio
import pytest

import cwsandbox_async as cwa
from cwsandbox_async.backends.local._cgroup import CgroupManager

from .conftest import exists, local_session, read_text, requires_isolation

pytestmark = [
    requires_isolation,
    pytest.mark.skipif(not CgroupManager().available, reason="no writable cgroup controller here"),
]

#: A short CPU-bound job (about a third of a second of CPU on this kind of machine).
JOB = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.35:\n    pass\nprint('done')"
BUSY = "for i in $(seq 60); do setsid sh -c 'while :; do :; done' & done; sleep 60"


def host_groups(pid: int) -> dict[str, str]:
    """controller -> cgroup path of a host pid (v1 lines, or "" for v2)."""
    out = {}
    for line in read_text(f"/proc/{pid}/cgroup").splitlines():
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else [""]:
            out[c] = path
    return out


async def test_every_sandbox_has_its_own_cpu_group_without_any_limit(tag: str) -> None:
    unlimited = cwa.Resources(cpu=None, memory_mib=None, pids=None)
    async with local_session(tag, resources=unlimited) as s:
        sb = await s.sandbox()
        box = s.backend._boxes[sb.sandbox_id]  # type: ignore[attr-defined]
        groups = host_groups(box.pid)
        if s.backend._cgroups.version == "v2":  # type: ignore[attr-defined]
            assert sb.sandbox_id in groups[""]
        else:
            assert "cpu" in s.backend._cgroups.available  # type: ignore[attr-defined]
            assert groups["cpu"].endswith(f"{sb.sandbox_id}/agent"), groups  # the agent's own CPU group
        inside = await sb.exec("cat /proc/self/cgroup")  # the commands' is its sibling
        cpu_line = next(x for x in inside.stdout.splitlines() if x.split(":")[1] in ("cpu", ""))
        assert cpu_line.endswith("/cmd"), inside.stdout
        paths = list(box.cgroup.paths)
    assert paths and not any(exists(p) for p in paths)  # removed with the sandbox


async def test_the_agent_is_outside_its_commands_memory_limit(tag: str) -> None:
    async with local_session(tag, resources=cwa.Resources(memory_mib=96)) as s:
        sb = await s.sandbox()
        box = s.backend._boxes[sb.sandbox_id]  # type: ignore[attr-defined]
        if "memory" not in s.backend._cgroups.available:  # type: ignore[attr-defined]
            pytest.skip("no memory controller here")
        agent = host_groups(box.pid)["memory" if s.backend._cgroups.version == "v1" else ""]  # type: ignore[attr-defined]
        assert agent.split("/")[-1] in (f"cwsandbox_async-{sb.sandbox_id}", "agent"), agent
        inside = await sb.exec("cat /proc/self/cgroup")  # the cgroup namespace starts at the sandbox's groups
        memory_line = next(x for x in inside.stdout.splitlines() if ":memory:" in x or x.startswith("0::"))
        assert memory_line.endswith("/cmd"), inside.stdout
        r = await sb.exec(["python3", "-c", "x = bytearray(1 << 30); print('survived')"], timeout_seconds=30)
        assert r.returncode == -9 and "survived" not in r.stdout
        assert (await sb.exec(["echo", "alive"])).stdout == "alive\n"  # the agent was not the victim
        assert (await sb.run_python("print(6 * 7)")).stdout == "42\n"


async def test_a_busy_neighbour_does_not_starve_a_sandbox(tag: str) -> None:
    """60 busy loops in 60 sessions in one sandbox; a neighbour's short CPU job still gets its share."""
    async with local_session(tag) as s:
        busy, victim = await s.sandbox(), await s.sandbox()
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: busy.exec(BUSY, timeout_seconds=60))
            await anyio.sleep(1.0)  # the loops are running
            start = time.monotonic()
            r = await victim.exec(["python3", "-c", JOB], timeout_seconds=30)
            took = time.monotonic() - start
            tg.cancel_scope.cancel()
        assert r.stdout == "done\n"
        # Sharing the CPU by group, the job gets about half a core against 60 loops; by process it would
        # get 1/61 of it (over 20 s here).
        assert took < 6, f"the neighbour's job took {took:.1f} s"
