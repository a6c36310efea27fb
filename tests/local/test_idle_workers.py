"""An idle sandbox keeps no worker, not one per exec it ever ran at once (each costs 1-2 MiB): its
template births the next one when a request comes."""

from __future__ import annotations

import os

import anyio

from .conftest import local_session, requires_isolation, wait_until

pytestmark = requires_isolation


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (bwrap's agent, its workers and their commands)."""
    out: list[int] = []
    stack = [pid]
    while stack:
        here = stack.pop()
        try:
            tasks = os.listdir(f"/proc/{here}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{here}/task/{tid}/children") as f:
                    kids = [int(x) for x in f.read().split()]
            except OSError:
                continue
            out.extend(kids)
            stack.extend(kids)
    return out


async def test_idle_workers_are_retired(tag: str) -> None:
    async with local_session(tag, backend_options={"worker_idle_trim_seconds": 1.5}) as s:
        sb = await s.sandbox()
        root = s.backend._boxes[sb.sandbox_id].pid  # type: ignore[attr-defined]
        assert root is not None
        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(sb.exec, ["sleep", "0.3"])
        # Right after the burst: the agent's template and four workers (and possibly a spare); the
        # agent is the root.
        assert len(descendants(root)) >= 5
        await wait_until(lambda: len(descendants(root)) == 1, within=10)  # its template only
        r = await sb.exec(["echo", "still works"])
        assert r.returncode == 0 and r.stdout == "still works\n"
