"""An exec's CPU priority (``cpu_priority``) on the local backend: its sandbox's CPU weight, raised by the
driver while the exec runs, lowered again however the exec ends, and out of the program's reach.

The weight is read from the host (the driver's side of the sandbox's cgroup). What the priority is worth
under overload is ``test_overload_penalty``'s subject.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest
from guards import HANG_GUARD_SECONDS, LONG_SECONDS

import cwsandbox_async as cwa
from cwsandbox_async.backends.local._cgroup import SandboxCgroup

from .conftest import local_session, read_text, requires_isolation, wait_until

pytestmark = requires_isolation

WAIT_FOR_GO = "import os, time\nwhile not os.path.exists('/tmp/go'):\n    time.sleep(0.01)\nprint('went')\n"


@asynccontextmanager
async def weighted(tag: str, isolation: str = "auto") -> AsyncIterator[tuple[cwa.Sandbox, SandboxCgroup]]:
    """A sandbox and its cgroup (skips where the backend has no CPU group to weigh)."""
    async with local_session(tag, isolation) as s:
        sb = await s.sandbox()
        cg = s.backend._boxes[sb.sandbox_id].cgroup  # type: ignore[attr-defined]
        if cg is None or cg.weight_file is None:
            pytest.skip("no writable cpu cgroup here: there is no priority to give (the exec runs at its usual share)")
        yield sb, cg


def weight(cg: SandboxCgroup) -> str:
    assert cg.weight_file is not None
    return read_text(cg.weight_file).strip()


async def test_the_weight_is_raised_while_the_exec_runs_and_lowered_when_it_ends(tag: str, isolation: str) -> None:
    async with weighted(tag, isolation) as (sb, cg):
        usual = weight(cg)
        assert usual == cg.weight_usual and int(cg.weight_priority) > int(usual)
        results: list[cwa.ExecResult] = []

        async def wait_for_go() -> None:
            results.append(
                await sb.run_python(
                    WAIT_FOR_GO, timeout_seconds=LONG_SECONDS, cpu_seconds=5, exclusive=True, cpu_priority=True
                )
            )

        with anyio.fail_after(HANG_GUARD_SECONDS):
            async with anyio.create_task_group() as tg:
                tg.start_soon(wait_for_go)
                await wait_until(lambda: weight(cg) == cg.weight_priority)
                assert cg.priority_holders == 1
                await sb.write_file("/tmp/go", b"")  # file calls run beside an exclusive exec
        assert results[0].stdout == "went\n", results
        assert weight(cg) == usual and cg.priority_holders == 0
        # without the flag, the weight is never touched
        r = await sb.run_python("print(1)", timeout_seconds=HANG_GUARD_SECONDS, cpu_seconds=1, exclusive=True)
        assert r.stdout == "1\n" and weight(cg) == usual


async def test_the_weight_is_lowered_after_a_timeout_and_after_a_cancelled_exec(tag: str) -> None:
    async with weighted(tag) as (sb, cg):
        usual = weight(cg)
        with pytest.raises(cwa.SandboxTimeoutError):  # its wall time ends it: sleeping uses no CPU
            await sb.exec(
                ["sleep", str(LONG_SECONDS)], timeout_seconds=0.5, cpu_seconds=5, exclusive=True, cpu_priority=True
            )
        assert weight(cg) == usual and cg.priority_holders == 0
        with anyio.move_on_after(HANG_GUARD_SECONDS) as guard:
            async with anyio.create_task_group() as tg:

                async def sleep() -> None:
                    await sb.exec(
                        ["sleep", str(LONG_SECONDS)],
                        timeout_seconds=LONG_SECONDS,
                        cpu_seconds=5,
                        exclusive=True,
                        cpu_priority=True,
                    )

                tg.start_soon(sleep)
                await wait_until(lambda: weight(cg) == cg.weight_priority)
                tg.cancel_scope.cancel()  # the caller gives up on the exec
        assert not guard.cancelled_caught
        assert weight(cg) == usual and cg.priority_holders == 0


async def test_the_program_cannot_raise_its_own_weight(tag: str) -> None:
    """From inside, every cgroup weight file the program can name, the host's path of its own included, and a
    cgroup file system of its own: nothing is written, nothing mounted; the weight stays the driver's."""
    async with weighted(tag) as (sb, cg):
        usual = weight(cg)
        assert cg.weight_file is not None
        attack = f"""
import glob, os, ctypes
own = {cg.weight_file!r}
done = []
for path in [own, *glob.glob("/sys/fs/cgroup/**/cpu.shares", recursive=True),
             *glob.glob("/sys/fs/cgroup/**/cpu.weight", recursive=True)]:
    try:
        with open(path, "w") as f:
            f.write("262144" if path.endswith("shares") else "10000")
        done.append(path)
    except OSError:
        pass
libc = ctypes.CDLL(None, use_errno=True)
for fs, opts in ((b"cgroup2", None), (b"cgroup", b"cpu")):
    os.makedirs("/tmp/cg", exist_ok=True)
    if libc.mount(fs, b"/tmp/cg", fs, 0, opts) == 0:
        done.append("mounted " + fs.decode())
print("WROTE", done)
"""
        r = await sb.run_python(attack, timeout_seconds=HANG_GUARD_SECONDS)
        assert r.returncode == 0 and "WROTE []" in r.stdout, r
        assert weight(cg) == usual
        # nor while it holds the priority: the weight it has then is the driver's, and it goes back
        r = await sb.run_python(
            attack, timeout_seconds=HANG_GUARD_SECONDS, cpu_seconds=5, exclusive=True, cpu_priority=True
        )
        assert r.returncode == 0 and "WROTE []" in r.stdout, r
        assert weight(cg) == usual


async def test_without_a_cpu_cgroup_the_exec_runs_at_its_usual_share(tag: str) -> None:
    async with local_session(tag, backend_options={"cgroups": False}) as s:
        sb = await s.sandbox()
        assert s.backend._boxes[sb.sandbox_id].cgroup is None  # type: ignore[attr-defined]
        r = await sb.run_python(
            "print(2)", timeout_seconds=HANG_GUARD_SECONDS, cpu_seconds=1, exclusive=True, cpu_priority=True
        )
        assert r.stdout == "2\n"
