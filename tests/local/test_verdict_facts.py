"""The facts the local agent reports for a verdict: OOM kills, CPU budget, run-queue wait, exclusive execs.

Run against the backend directly (``ExecRequest`` carries ``cpu_seconds`` and ``exclusive``), so
each assertion is about what the agent measured, not about how a layer above classifies it. Each
test creates its sandboxes in its own body (not in a fixture).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from guards import HANG_GUARD_SECONDS

from cwsandbox_async import Resources
from cwsandbox_async._types import ExecExit, SandboxDefaults
from cwsandbox_async._verdict import is_starved
from cwsandbox_async.backends.local import LocalBackend
from cwsandbox_async.testing.contract import make_request, make_spec

from .conftest import requires_isolation

pytestmark = requires_isolation


class Box:
    def __init__(self, backend: LocalBackend, sid: str) -> None:
        self.backend, self.sid = backend, sid

    async def sh(self, script: str, **options: Any) -> ExecExit:
        return await self.run(["sh", "-c", script], **options)

    async def run(self, argv: list[str], *, timeout: float = 30.0, **options: Any) -> ExecExit:  # noqa: ASYNC109
        # (``timeout`` is the exec's own timeout, enforced by the agent, not a wait of this coroutine)
        request = dataclasses.replace(make_request(*argv, timeout=timeout), **options)
        return await self.backend.exec(self.sid, request)

    async def py(self, source: str, *, timeout: float = 30.0, **options: Any) -> ExecExit:  # noqa: ASYNC109
        request = dataclasses.replace(make_request("python3", timeout=timeout), **options)
        return await self.backend.run_python(self.sid, source, request)


async def new_box(backend: LocalBackend, tag: str, **overrides: Any) -> Box:
    spec = make_spec(tag, **overrides)
    await backend.create(spec)
    return Box(backend, spec.sandbox_id)


@contextlib.asynccontextmanager
async def sandbox(backend: LocalBackend, tag: str, **overrides: Any) -> AsyncIterator[Box]:
    """A sandbox created in the test's own task (see the module docstring), destroyed on exit."""
    b = await new_box(backend, tag, **overrides)
    try:
        yield b
    finally:
        await backend.destroy(b.sid)


BUSY = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < {s}: pass\n"
#: A busy daemon, double-forked away from the program, which itself only sleeps.
DOUBLE_FORK = (
    "import os, time\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    if os.fork() == 0:\n"
    "        t = time.monotonic()\n"
    "        while time.monotonic() - t < 30: pass\n"
    "    os._exit(0)\n"
    "time.sleep(15)\n"
)


# -- OOM ------------------------------------------------------------------------------------------
async def test_an_oom_kill_is_reported_as_such(backend: LocalBackend, tag: str) -> None:
    b = await new_box(backend, tag, resources=Resources(memory_mib=128))
    if "memory" not in backend.limits:
        pytest.skip("no memory cgroup here")
    try:
        r = await b.py("x = bytearray(1 << 31)")  # 2 GiB under 128 MiB
        assert (r.returncode, r.oom_killed) == (-9, True), r
        # A grandchild killed by the OOM killer while its parent survives: still this exec's OOM.
        r = await b.py("import subprocess, sys\nr = subprocess.run([sys.executable, '-c', 'bytearray(1 << 31)'])\n"
                       "print(r.returncode)")  # fmt: skip
        assert (r.returncode, r.stdout, r.oom_killed) == (0, b"-9\n", True), r
        # A SIGKILL that is not the OOM killer's is not an OOM kill.
        r = await b.sh("kill -9 $$")
        assert (r.returncode, r.oom_killed) == (-9, False)
        r = await b.py("print('fine')")
        assert (r.stdout, r.oom_killed) == (b"fine\n", False)
    finally:
        await backend.destroy(b.sid)


# -- CPU budget -----------------------------------------------------------------------------------
async def test_a_cpu_budget_ends_the_whole_tree(backend: LocalBackend, tag: str) -> None:
    async with sandbox(backend, tag) as box:
        await _test_a_cpu_budget_ends_the_whole_tree(box)


async def _test_a_cpu_budget_ends_the_whole_tree(box: Box) -> None:
    r = await box.py(BUSY.format(s=30), cpu_seconds=0.5, timeout=20)
    assert r.cpu_exceeded and r.returncode == -9 and not r.timed_out  # ended by its budget, not its timeout
    assert 0.5 <= r.cpu_seconds < 2.5
    # Its children's CPU counts too, daemons that left the exec's process group included.
    r = await box.sh(f"python3 -c '{BUSY.format(s=30)}' & setsid python3 -c '{BUSY.format(s=30)}' & wait",
                     cpu_seconds=0.6, timeout=20)  # fmt: skip
    assert r.cpu_exceeded and 0.6 <= r.cpu_seconds < 3.0, r
    # A double-forked daemon is re-parented to the command (a subreaper), not to PID 1: still sampled.
    r = await box.py(DOUBLE_FORK, cpu_seconds=0.6, timeout=20)
    assert r.cpu_exceeded and not r.timed_out, r
    # Sleeping costs no CPU: a budget does not end it.
    r = await box.sh("sleep 0.6; echo done", cpu_seconds=0.3)
    assert (r.returncode, r.stdout, r.cpu_exceeded) == (0, b"done\n", False)


# -- run-queue wait ---------------------------------------------------------------------------------
async def test_a_program_that_sleeps_has_no_run_queue_wait(backend: LocalBackend, tag: str) -> None:
    async with sandbox(backend, tag) as box:
        await _test_a_program_that_sleeps_has_no_run_queue_wait(box)


async def _test_a_program_that_sleeps_has_no_run_queue_wait(box: Box) -> None:
    r = await box.sh("sleep 2", timeout=1)
    assert r.timed_out
    # asleep for almost all of its second: only its start (a shell, then sleep) can have waited for a CPU,
    # which on a busy machine is a few tenths of a second; sleeping itself is never counted
    assert r.cpu_wait_seconds is not None and r.cpu_wait_seconds < 0.5 * r.wall_seconds, r


async def test_busy_children_of_its_own_do_not_count_as_waiting_for_others(backend: LocalBackend, tag: str) -> None:
    async with sandbox(backend, tag) as box:
        await _test_busy_children_of_its_own_do_not_count_as_waiting_for_others(box)


async def _test_busy_children_of_its_own_do_not_count_as_waiting_for_others(box: Box) -> None:
    """Eight busy processes of one exec queue behind each other: the wait is capped by the CPU the
    tree itself left unused (``cpus * wall - cpu``), so on a free machine it is about nothing."""
    procs = " ".join(f"python3 -c '{BUSY.format(s=5)}' &" for _ in range(8))
    r = await box.sh(procs + " wait", timeout=1.5)
    assert r.timed_out and r.cpu_wait_seconds is not None
    cpus = len(os.sched_getaffinity(0))
    assert r.cpu_wait_seconds <= max(0.0, cpus * r.wall_seconds - r.cpu_seconds) + 0.05, r


async def test_daemons_that_left_the_process_group_still_count(backend: LocalBackend, tag: str) -> None:
    """The double-fork attack: busy daemons make the main process wait; their CPU is the program's."""
    main = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 1: pass\nprint(time.process_time())"
    daemons = "for i in 1 2 3 4; do (setsid python3 -c '" + BUSY.format(s=5) + "' &) ; done; "
    async with sandbox(backend, tag) as box:
        r = await box.sh(daemons + f'python3 -c "{main}"', timeout=HANG_GUARD_SECONDS)
    own = float(r.stdout)
    assert r.returncode == 0 and r.cpu_seconds > 1.5 * own, (own, r)


@contextlib.asynccontextmanager
async def starved(backend: LocalBackend, tag: str) -> AsyncIterator[Box]:
    """A sandbox beside a neighbour that holds the machine: 12 busy processes with a far bigger CPU weight.

    Every sandbox has its own CPU group, so a neighbour sandbox starves another only with a far bigger
    weight (equal weights share the CPU: the fairness protection, tests/local/test_cgroups.py)."""
    heavy = LocalBackend(cpu_weight=10000)
    victim, hog = await new_box(backend, tag), await new_box(heavy, tag)
    try:
        # Each hog process says it is up before it spins (until cancelled): the victim starts only once all
        # 12 are busy. A fixed head start was not enough at load: the hog's forks were held up too, and the
        # victim ran with the machine to itself (1.66 s of CPU in 2 s).
        up = 'import os\nopen("/tmp/up.%d" % os.getpid(), "w").close()\n'
        spin = up + BUSY.format(s=HANG_GUARD_SECONDS)
        procs = " ".join(f"python3 -c '{spin}' &" for _ in range(12))
        async with anyio.create_task_group() as tg:
            tg.start_soon(hog.sh, procs + " wait")
            ready = "until [ $(ls /tmp | grep -c '^up[.]') -ge 12 ]; do sleep 0.05; done"
            assert (await hog.sh(ready, timeout=HANG_GUARD_SECONDS)).returncode == 0
            yield victim
            tg.cancel_scope.cancel()
    finally:
        await backend.destroy(victim.sid)
        await heavy.destroy(hog.sid)
        await heavy.aclose()


async def test_a_program_starved_by_a_neighbour_shows_run_queue_wait(backend: LocalBackend, tag: str) -> None:
    async with starved(backend, tag) as victim:
        r = await victim.py(BUSY.format(s=10), timeout=2)
    assert r.timed_out and r.cpu_wait_seconds is not None
    assert r.cpu_wait_seconds > 0.25 * r.wall_seconds, r


#: 32 processes that each want 2 ms of CPU, say when they had it, then sleep (as the first does at once).
QUEUE_THEN_SLEEP = (
    "import os, time\n"
    "print('start', time.monotonic(), flush=True)\n"
    "for _ in range(32):\n"
    "    if os.fork() == 0:\n"
    "        t = time.process_time()\n"
    "        while time.process_time() - t < 0.002: pass\n"
    "        print('spun', time.monotonic(), flush=True)\n"
    "        time.sleep(60)\n"
    "        os._exit(0)\n"
    "time.sleep(60)\n"
)


@contextlib.asynccontextmanager
async def host_busy_loops(n: int) -> AsyncIterator[None]:
    """``n`` busy loops on the host, outside every sandbox, for the block."""
    null = subprocess.DEVNULL
    argv = ["python3", "-c", "while True: pass"]
    async with contextlib.AsyncExitStack() as stack:
        procs = [
            await stack.enter_async_context(await anyio.open_process(argv, stdin=null, stdout=null, stderr=null))
            for _ in range(n)
        ]
        try:
            yield
        finally:
            for p in procs:
                p.kill()


async def test_processes_that_wait_together_wait_once_and_a_sleeper_is_not_starved(
    backend: LocalBackend, tag: str
) -> None:
    """32 processes of a program queue together at its start, on a machine others hold (8 busy loops
    on the host), then it sleeps to its timeout. Its wait is wall time: each moment counted once, however
    many of its processes waited in it, so about the time until the last of them had its CPU (give or take
    the sampling's resolution). Summed over processes, 32 processes waiting a few tenths of a second
    each came to more than the wall time, and the sleeper's timeout looked starved: a JVM's threads at its
    start did that in the judge (its "sleep" case scored ``starved``, unscored, instead of ``time_limit``)."""
    async with sandbox(backend, tag) as box, host_busy_loops(8):
        r = await box.py(QUEUE_THEN_SLEEP, timeout=6)
    assert r.timed_out and r.cpu_wait_seconds is not None, r
    lines = r.stdout.decode().split()
    start, spun = float(lines[1]), [float(v) for k, v in zip(lines[::2], lines[1::2], strict=True) if k == "spun"]
    assert len(spun) == 32, r.stdout
    queued = max(spun) - start  # until the last of them had its CPU
    # The interval in which the last had its CPU counts whole, and on a loaded machine PID 1's next sample
    # is late: a quarter of the sleep after it is far more than that resolution and far less than the sum.
    assert r.cpu_wait_seconds <= queued + (r.wall_seconds - queued) / 4, (queued, r)
    if queued < r.wall_seconds / 4:  # then the program's own sleep, not the machine, took most of its time
        assert not is_starved(r, SandboxDefaults()), (queued, r)


def cpu_of(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def test_others_cpu_is_what_the_rest_of_the_machine_used_not_the_sandbox(backend: LocalBackend, tag: str) -> None:
    """Measured on the host: a busy loop outside the sandbox counts, the sandbox's own loop does not."""
    async with sandbox(backend, tag) as box:
        # no pipes, and closed by the block (a process only waited for leaves its transport to the
        # collector, which warned in whatever test ran next on this worker)
        null = subprocess.DEVNULL
        hog_argv = ["python3", "-c", "while True: pass"]
        async with await anyio.open_process(hog_argv, stdin=null, stdout=null, stderr=null) as hog:
            try:
                await anyio.sleep(0.2)
                before = cpu_of(hog.pid)
                r = await box.py(BUSY.format(s=30), timeout=1.5)
                hog_cpu = cpu_of(hog.pid) - before
            finally:
                hog.kill()
        assert r.timed_out and r.others_cpu_seconds is not None, r
        # at least the hog's CPU time over the exec (ticks: 10 ms per CPU either side)
        assert r.others_cpu_seconds >= hog_cpu - 0.1, (hog_cpu, r)
        # and no more than the machine could do beside what the sandbox itself used
        cpus = len(os.sched_getaffinity(0))
        assert r.others_cpu_seconds <= cpus * r.wall_seconds + 0.5 - 0.5 * r.cpu_seconds, r
        quick = await box.sh("true")
        assert quick.others_cpu_seconds is None  # measured for timed-out execs only


# -- exclusive ----------------------------------------------------------------------------------------
async def test_an_exclusive_exec_runs_alone(backend: LocalBackend, tag: str) -> None:
    async with sandbox(backend, tag) as box:
        await _test_an_exclusive_exec_runs_alone(box)


async def _test_an_exclusive_exec_runs_alone(box: Box) -> None:
    results: dict[str, ExecExit] = {}

    async def bystander() -> None:
        results["bystander"] = await box.sh("echo started; sleep 20; echo survived")

    async with anyio.create_task_group() as tg:
        tg.start_soon(bystander)
        await box.sh("setsid sleep 3737 > /dev/null 2>&1 < /dev/null & sleep 0.3")  # gone with its exec anyway
        await anyio.sleep(0.5)
        exclusive = await box.py(
            "import os\nme = {os.getpid(), os.getppid()}\n"
            "for p in os.listdir('/proc'):\n"
            "    if p.isdigit() and int(p) not in me:\n"
            "        a = open(f'/proc/{p}/cmdline', 'rb').read()\n"
            "        if b'cwsandbox-' not in a: print(a)\n",
            exclusive=True,
        )
    assert exclusive.returncode == 0 and exclusive.stdout == b"", exclusive  # nothing else was running
    by = results["bystander"]
    assert by.returncode == -9 and b"survived" not in by.stdout and b"exclusive exec" in by.stderr
    r = await box.sh("echo after")  # the sandbox serves on
    assert r.stdout == b"after\n"


async def test_requests_after_an_exclusive_exec_wait_for_it(backend: LocalBackend, tag: str) -> None:
    async with sandbox(backend, tag) as box:
        await _test_requests_after_an_exclusive_exec_wait_for_it(box)


async def _test_requests_after_an_exclusive_exec_wait_for_it(box: Box) -> None:
    order: list[str] = []

    async def first() -> None:
        await box.sh("sleep 0.5", exclusive=True)
        order.append("exclusive")

    async def second() -> None:
        await anyio.sleep(0.1)
        await box.sh("true")
        order.append("after")

    async with anyio.create_task_group() as tg:
        tg.start_soon(first)
        tg.start_soon(second)
    assert order == ["exclusive", "after"]


async def test_sandbox_cpu_counts_everything_the_sandbox_ran(backend: LocalBackend, tag: str) -> None:
    """While a program sleeps, another exec of the same sandbox burns CPU: not the program's tree, but
    the sandbox's (the Sandbox layer never calls a timeout starved when the sandbox itself was busy)."""
    if "sandbox_cpu_seconds" not in {f.name for f in dataclasses.fields(ExecExit)}:
        pytest.skip("ExecExit.sandbox_cpu_seconds comes with the verdict contract (branch verdict)")
    async with sandbox(backend, tag) as box, anyio.create_task_group() as tg:
        tg.start_soon(box.py, BUSY.format(s=3))
        await anyio.sleep(0.3)
        r = await box.sh("sleep 1")
        tg.cancel_scope.cancel()
    sandbox_cpu = getattr(r, "sandbox_cpu_seconds", None)
    # The sleeper's own tree used next to nothing; its sandbox many times that, whatever share of the
    # machine the busy exec got (on an idle machine about a core for the whole second).
    assert r.cpu_seconds < 0.1 and sandbox_cpu is not None, r
    assert sandbox_cpu > max(10 * r.cpu_seconds, 0.05), r


async def test_a_full_pids_limit_fails_new_execs_at_once(backend: LocalBackend, tag: str) -> None:
    """A fork bomb holds every pid of its sandbox: the next execs end quickly as "cannot start"
    (the program's doing, a result), not as a hang until the caller's deadline."""
    bomb = "import os, time\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        time.sleep(0.01)\n"
    async with sandbox(backend, tag, resources=Resources(pids=24)) as box, anyio.create_task_group() as tg:
        # The bomb holds its pids until it is cancelled below: an exec that waited for a free pid would
        # never end (the hang guard), one that waited out its own deadline would be timed out.
        tg.start_soon(lambda: box.py(bomb, timeout=10 * HANG_GUARD_SECONDS))
        await anyio.sleep(1.5)
        for _ in range(2):
            with anyio.fail_after(HANG_GUARD_SECONDS):
                r = await box.run(["echo", "x"], timeout=10 * HANG_GUARD_SECONDS)
            assert r.returncode in (0, 126) and not r.timed_out, r
            if r.returncode == 126:
                assert b"no process available" in r.stderr or b"cannot start" in r.stderr
        tg.cancel_scope.cancel()
