"""A sandbox at rest is one process, its PID 1, and an idle PID 1 sleeps.

Nothing is kept for later requests: no template, no worker (each would cost 1-2 MiB per sandbox).
Every exec is one fork of PID 1, gone with its exec.
"""

from __future__ import annotations

import os

import anyio
from proctree import descendants

from .conftest import local_session, requires_isolation, wait_until

pytestmark = requires_isolation


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def test_a_sandbox_is_one_process_before_and_after_a_burst(tag: str) -> None:
    async with local_session(tag) as s:
        sb = await s.sandbox()
        root = s.backend._boxes[sb.sandbox_id].pid  # type: ignore[attr-defined]
        assert root is not None
        assert descendants(root) == set()  # born: PID 1 only
        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(sb.exec, ["sleep", "0.3"])
            tg.start_soon(sb.run_python, "import time; time.sleep(0.3)")
            await anyio.sleep(0.15)
            assert len(descendants(root)) >= 5  # one process per exec while they run
        await wait_until(lambda: descendants(root) == set())
        await sb.write_file("/workspace/f", b"x")
        assert await sb.read_file("/workspace/f") == b"x"
        assert descendants(root) == set()  # file helpers are gone with their operation too


async def test_an_idle_pid_1_uses_no_cpu(tag: str) -> None:
    async with local_session(tag) as s:
        sb = await s.sandbox()
        root = s.backend._boxes[sb.sandbox_id].pid  # type: ignore[attr-defined]
        assert (await sb.exec(["sh", "-c", "kill -STOP 1; kill -CHLD 1; true"])).returncode == 0
        before = cpu_seconds(root)
        await anyio.sleep(1.5)
        assert cpu_seconds(root) - before < 0.2
        assert (await sb.run_python("print('still serves')")).stdout == "still serves\n"
