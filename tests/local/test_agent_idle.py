"""An idle agent sleeps: no busy loop, whatever state its template and workers were left in."""

from __future__ import annotations

import os

import anyio

from .conftest import local_session, requires_isolation

pytestmark = requires_isolation


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def test_an_idle_agent_uses_no_cpu_even_without_its_template(tag: str) -> None:
    async with local_session(tag, backend_options={"worker_idle_trim_seconds": 0.3}) as s:
        sb = await s.sandbox()
        box = s.backend._boxes[sb.sandbox_id]  # type: ignore[attr-defined]
        template = box.channel.hello["template"]
        # A clean worker kills the template: the agent keeps that worker once idle (it cannot fork a
        # clean one itself), and must then simply wait.
        r = await sb.run_python(f"import os; os.kill({template}, 9)")
        assert r.returncode == 0
        await anyio.sleep(1.0)  # past the idle trim
        before = cpu_seconds(box.pid)
        await anyio.sleep(1.5)
        assert cpu_seconds(box.pid) - before < 0.2
        assert (await sb.run_python("print('still serves')")).stdout == "still serves\n"
