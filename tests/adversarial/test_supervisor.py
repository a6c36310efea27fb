"""The supervisor out of the program's reach: a command cannot change PID 1, and its verdicts hold.

All commands of a sandbox run as one user, and so does its PID 1; the kernel's same-owner checks
would let any command lower PID 1's limits, renice it, pin it or make it ``SCHED_IDLE``. These
attacks are run from inside, and PID 1's state is read from the host before and after.
"""

from __future__ import annotations

import ctypes
import os
import platform
import resource
import signal
import time

import anyio
import pytest
import structlog
from guards import HANG_GUARD_SECONDS, LONG_SECONDS

import cwsandbox_async as cwa
from cwsandbox_async.integrations.trl import VerdictKind, code_reward

from .conftest import arena, host_processes_matching, requires_isolation

pytestmark = requires_isolation

IOPRIO_GET = {"x86_64": 252, "aarch64": 31}.get(platform.machine())

#: Every way a command could change PID 1 (or any process but itself); each result printed.
ATTACKS = r"""
import ctypes, errno, os, resource
libc = ctypes.CDLL(None, use_errno=True)
def attempt(name, f):
    try:
        f()
        print(name, "ok")
    except OSError as e:
        print(name, errno.errorcode.get(e.errno, e.errno))
for res in ("RLIMIT_NOFILE", "RLIMIT_CPU", "RLIMIT_AS", "RLIMIT_NPROC", "RLIMIT_STACK"):
    r = getattr(resource, res)
    attempt("prlimit " + res, lambda: resource.prlimit(1, r, (1, resource.prlimit(1, r)[1])))
attempt("renice", lambda: os.setpriority(os.PRIO_PROCESS, 1, 19))
attempt("renice user", lambda: os.setpriority(os.PRIO_USER, 0, 19))
attempt("renice group", lambda: os.setpriority(os.PRIO_PGRP, 1, 19))
attempt("pin", lambda: os.sched_setaffinity(1, {0}))
attempt("idle", lambda: os.sched_setscheduler(1, os.SCHED_IDLE, os.sched_param(0)))
attempt("batch", lambda: os.sched_setscheduler(1, os.SCHED_BATCH, os.sched_param(0)))
attempt("param", lambda: os.sched_setparam(1, os.sched_param(0)))
nr = {"x86_64": 251, "aarch64": 30}[os.uname().machine]
def ioprio():
    if libc.syscall(nr, 1, 1, 7 | (3 << 13)) != 0:  # IOPRIO_WHO_PROCESS, pid 1, idle class
        raise OSError(ctypes.get_errno(), "ioprio_set")
attempt("ioprio", ioprio)
"""


def supervisor_state(pid: int) -> dict[str, object]:
    """What a command could have changed about PID 1, read on the host."""
    with open(f"/proc/{pid}/limits") as f:
        limits = f.read()
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    with open(f"/proc/{pid}/status") as f:
        cpus = [line for line in f if line.startswith("Cpus_allowed_list")]
    state: dict[str, object] = {
        "limits": limits,
        "nice": int(fields[16]),
        "policy": int(fields[38]),
        "cpus": cpus,
        "affinity": sorted(os.sched_getaffinity(pid)),
    }
    if IOPRIO_GET is not None:
        libc = ctypes.CDLL(None, use_errno=True)
        state["ioprio"] = libc.syscall(IOPRIO_GET, 1, pid)
    return state


@pytest.mark.parametrize("how", ["exec", "run_python"])
async def test_no_command_can_change_the_supervisor(tag: str, how: str) -> None:
    """Every attempt fails with EPERM, and PID 1 (seen from the host) is as it was born."""
    async with arena(tag) as a:
        pid = a.host_pid(a.victim)
        before = supervisor_state(pid)
        if how == "exec":
            r = await a.victim.exec(["python3", "-I", "-c", ATTACKS], timeout_seconds=HANG_GUARD_SECONDS)
        else:
            r = await a.victim.run_python(ATTACKS, timeout_seconds=HANG_GUARD_SECONDS)
        assert r.returncode == 0, r.stderr
        results = dict(line.rsplit(" ", 1) for line in r.stdout.splitlines())
        assert results and all(v == "EPERM" for v in results.values()), results
        assert supervisor_state(pid) == before
        assert (await a.victim.exec(["echo", "still"], timeout_seconds=HANG_GUARD_SECONDS)).stdout == "still\n"


async def test_a_command_still_sets_its_own_limits_priority_and_cpus(tag: str) -> None:
    own = (
        "import os, resource\n"
        "resource.prlimit(0, resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n"
        "resource.setrlimit(resource.RLIMIT_CORE, (0, 0))\n"
        "os.nice(3)\n"
        "os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})\n"
        "os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))\n"
        "print(resource.getrlimit(resource.RLIMIT_NOFILE)[0], os.getpriority(os.PRIO_PROCESS, 0),"
        " len(os.sched_getaffinity(0)), resource.prlimit(1, resource.RLIMIT_NOFILE)[0] > 64)\n"
    )
    async with arena(tag) as a:
        r = await a.victim.run_python(own, timeout_seconds=HANG_GUARD_SECONDS)
        assert (r.returncode, r.stdout) == (0, "64 3 1 True\n"), r.stderr


async def test_a_lease_after_an_attack_gets_the_supervisor_as_born(tag: str) -> None:
    """Pool reuse: lease A attacks PID 1, lease B of the same sandbox runs at the birth state."""
    probe = (
        "import os, resource\n"
        "print(os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0), len(os.sched_getaffinity(0)),"
        " resource.getrlimit(resource.RLIMIT_AS)[0] == resource.RLIM_INFINITY,"
        " resource.getrlimit(resource.RLIMIT_NOFILE)[0] > 8)\n"
    )
    session = cwa.Session(cwa.SandboxDefaults(tags=(tag,)), backend="local", handle_signals=False)
    async with session as s, cwa.SandboxPool(s, size=1, max_size=1, reuse=True) as pool:
        async with pool.lease() as sb:
            first_id = sb.sandbox_id
            first = (await sb.run_python(probe, timeout_seconds=HANG_GUARD_SECONDS)).stdout
            await sb.run_python(ATTACKS, timeout_seconds=HANG_GUARD_SECONDS)
        async with pool.lease() as sb:
            assert sb.sandbox_id == first_id
            assert (await sb.run_python(probe, timeout_seconds=HANG_GUARD_SECONDS)).stdout == first


ONE_LINER = (
    "def solve(): return 41\n"
    "import resource\n"
    "resource.prlimit(1, resource.RLIMIT_NOFILE, (1, resource.prlimit(1, resource.RLIMIT_NOFILE)[1]))\n"
    "import time; time.sleep(1)\n"
)
#: The other attacks on PID 1 from the issue, each with a wrong ``solve``.
SUPERVISOR_ATTACKS = {
    "the one-liner": ONE_LINER,
    "PID 1's CPU limit, and sleepers for it to sample": (
        "def solve(): return 41\n"
        "import os, resource, threading, time\n"
        "try:\n"
        "    resource.prlimit(1, resource.RLIMIT_CPU, (0, 1))\n"
        "except OSError:\n"
        "    pass\n"
        "for _ in range(50):\n"
        "    threading.Thread(target=time.sleep, args=(3,), daemon=True).start()\n"
        "time.sleep(3)\n"
    ),
    "PID 1 pinned, niced, idle, beside busy loops and sleeping threads": (
        "def solve(): return 41\n"
        "import os, threading, time\n"
        "for f in (lambda: os.sched_setaffinity(1, {0}), lambda: os.setpriority(os.PRIO_PROCESS, 1, 19),\n"
        "          lambda: os.sched_setscheduler(1, os.SCHED_IDLE, os.sched_param(0))):\n"
        "    try:\n"
        "        f()\n"
        "    except OSError:\n"
        "        pass\n"
        "for _ in range(2):\n"
        "    if os.fork() == 0:\n"
        "        while True: pass\n"
        "for _ in range(200):\n"
        "    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
        "time.sleep(2)\n"  # then its tests run (and fail), while its busy children still run
    ),
}


async def test_attacks_on_the_supervisor_score_zero_not_none() -> None:
    """Through ``code_reward`` against ``assert solve() == 42``: 0.0 for each, never None (not scored)."""
    reward = code_reward(tests_column="tests", pool_size=0, timeout_seconds=20, verbose=False)
    try:
        with anyio.fail_after(HANG_GUARD_SECONDS):
            rewards = await reward(
                completions=[f"<answer>\n{code}</answer>" for code in SUPERVISOR_ATTACKS.values()],
                tests=["assert solve() == 42\n"] * len(SUPERVISOR_ATTACKS),
            )
    finally:
        await reward.aclose()
    assert dict(zip(SUPERVISOR_ATTACKS, rewards, strict=True)) == dict.fromkeys(SUPERVISOR_ATTACKS, 0.0)


async def test_forged_starvation_scores_zero_not_none() -> None:
    """The issue's forge (32 pinned processes waking every 10 ms) times out: 0.0, never None, at any load."""
    reward = code_reward(tests_column="tests", pool_size=0, timeout_seconds=3, verbose=False)
    try:
        with anyio.fail_after(HANG_GUARD_SECONDS):
            rewards = await reward(
                completions=[f"<answer>\ndef solve(): return 41\n{FORGED_STARVATION}</answer>"],
                tests=["assert solve() == 42\n"],
            )
    finally:
        await reward.aclose()
    assert rewards == [0.0]


#: 32 processes pinned to one CPU that all wake every 10 ms: they wait for each other, not for anyone else.
FORGED_STARVATION = (
    "import os, time\n"
    "for _ in range(32):\n"
    "    if os.fork() == 0:\n"
    "        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
    "        while True:\n"
    "            time.sleep(0.01 - time.monotonic() % 0.01)\n"
    "time.sleep(30)\n"
)


async def test_a_program_cannot_forge_starvation_with_its_own_tasks(tag: str) -> None:
    """Whatever the machine's load: the pinned tasks asked to wait, and the main one only sleeps.

    (The same crowd unpinned is starved only when others held most of the machine's CPUs: that
    rule is ``tests/test_verdicts.py``'s, on measured figures.)"""
    async with arena(tag) as a:
        with pytest.raises(cwa.SandboxTimeoutError) as info:
            await a.victim.run_python(FORGED_STARVATION, timeout_seconds=3)
        err = info.value
        assert err.result is not None and err.result.timed_out
        assert not err.infrastructure and not err.result.starved, err.result


async def test_a_supervisor_that_cannot_read_proc_kills_everything_at_the_timeout(tag: str) -> None:
    """Fail closed: with PID 1 unable to open a file (its NOFILE soft limit lowered from the host, as a
    command could before the filter), a ``setsid`` grandchild still dies at its exec's timeout."""
    mark = str(6000 + os.getpid() % 1000)
    script = (
        "import os\n"
        f"if os.fork() == 0:\n    os.setsid()\n    os.execvp('sleep', ['sleep', '{mark}'])\n"
        f"os.execvp('sleep', ['sleep', '{mark}'])\n"
    )
    async with arena(tag) as a:
        pid = a.host_pid(a.victim)
        soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        async with anyio.create_task_group() as tg:

            async def lower_when_started() -> None:
                with anyio.fail_after(HANG_GUARD_SECONDS):
                    while len(host_processes_matching(f"sleep {mark}".encode())) < 2:  # noqa: ASYNC110
                        await anyio.sleep(0.02)  # (a poll of the host's process table: nothing to wait on)
                resource.prlimit(pid, resource.RLIMIT_NOFILE, (3, hard))

            tg.start_soon(lower_when_started)
            with pytest.raises(cwa.SandboxTimeoutError) as info:
                await a.victim.exec(["python3", "-I", "-c", script], timeout_seconds=3)
        assert not info.value.infrastructure
        try:
            assert host_processes_matching(f"sleep {mark}".encode()) == []
        finally:
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))
        assert (await a.victim.exec(["echo", "after"], timeout_seconds=HANG_GUARD_SECONDS)).stdout == "after\n"


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("PPid:")).split()[1])


#: How long the template is held stopped after PID 1 is killed (``killed, reaped late``): longer
#: than the driver used to look for the evidence (2 s), so that it must wait for it.
REAPER_HELD_SECONDS = 3.0


@pytest.mark.parametrize("how", ["exits", "killed", "killed, reaped late"])
async def test_whose_failure_a_dead_supervisor_is_follows_how_it_ended(tag: str, how: str) -> None:
    """PID 1 giving up (exiting: here its poll fails once its NOFILE limit is below its descriptors,
    what a command's prlimit did before the filter) is the program's failure; PID 1 killed by a signal,
    which nothing inside can send it, is infrastructure. Every later call says the same.

    The evidence is PID 1's wait status, there once the template reaped it: on a stalled machine that
    is late, and the verdict waits for it (``killed, reaped late`` holds the template stopped, as a
    starved one is, well past the moment the channel closed)."""
    async with arena(tag) as a:
        pid = a.host_pid(a.victim)
        reaper = parent_of(pid)  # the template's serving process
        resumed: list[float] = []
        async with anyio.create_task_group() as tg:

            async def strike() -> None:
                await anyio.sleep(0.5)
                if how == "exits":
                    hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)[1]
                    resource.prlimit(pid, resource.RLIMIT_NOFILE, (1, hard))
                elif how == "killed":
                    os.kill(pid, 9)
                else:
                    os.kill(reaper, signal.SIGSTOP)
                    try:
                        os.kill(pid, 9)
                        await anyio.sleep(REAPER_HELD_SECONDS)
                    finally:
                        resumed.append(time.monotonic())
                        os.kill(reaper, signal.SIGCONT)

            tg.start_soon(strike)
            with anyio.fail_after(HANG_GUARD_SECONDS), pytest.raises(cwa.SandboxNotRunningError) as info:
                await a.victim.exec(["sleep", str(LONG_SECONDS)], timeout_seconds=LONG_SECONDS)
        failed_at = time.monotonic()
        want = how != "exits"
        assert info.value.infrastructure is want, info.value
        if resumed:
            assert failed_at >= resumed[0], "the call failed before the template could reap PID 1"
        assert ("killed by signal 9" if want else "exited with status") in str(info.value)
        for _ in range(2):
            with pytest.raises(cwa.SandboxNotRunningError) as later:
                await a.victim.exec(["true"], timeout_seconds=HANG_GUARD_SECONDS)
            assert later.value.infrastructure is want, later.value


async def test_a_reaper_that_never_reaps_ends_the_wait_at_its_guard_and_says_so(tag: str) -> None:
    """The wait for PID 1's wait status is bounded: past the guard (shortened here) the death is
    unknown, which is the program's (no evidence from outside), and a WARNING says why."""
    async with arena(tag, {"exit_status_wait_seconds": 0.5}) as a:
        pid = a.host_pid(a.victim)
        reaper = parent_of(pid)
        os.kill(reaper, signal.SIGSTOP)
        try:
            with structlog.testing.capture_logs() as logs:
                os.kill(pid, 9)
                with anyio.fail_after(HANG_GUARD_SECONDS), pytest.raises(cwa.SandboxNotRunningError) as info:
                    await a.victim.exec(["sleep", str(LONG_SECONDS)], timeout_seconds=LONG_SECONDS)
        finally:
            os.kill(reaper, signal.SIGCONT)
        assert info.value.infrastructure is False, info.value
        assert "killed by signal" not in str(info.value)
        unknown = [e for e in logs if e["event"] == "sandbox exit status unknown"]
        assert unknown and {e["sandbox_id"] for e in unknown} == {a.victim.sandbox_id}, logs
        assert "0.5 s" in unknown[0]["reason"]  # the channel's wait or the pidfd's, whichever ends first
        assert unknown[0]["log_level"] == "warning"


#: Twenty children burning 0.1 s each, one after another, reaped by the kernel (SIGCHLD ignored): no
#: rusage anywhere, and never more than 0.1 s of CPU alive at a sample.
UNREAPED = (
    "import os, signal, time\n"
    "signal.signal(signal.SIGCHLD, signal.SIG_IGN)\n"
    "for _ in range(20):\n"
    "    if os.fork() == 0:\n"
    "        end = time.process_time() + 0.1\n"
    "        while time.process_time() < end:\n"
    "            pass\n"
    "        os._exit(0)\n"
    "    try:\n"
    "        os.wait()\n"
    "    except ChildProcessError:\n"
    "        pass\n"
    "time.sleep(0.5)\n"
)


@pytest.mark.parametrize("where", ["request", "resources"])
async def test_a_cpu_budget_counts_children_nobody_reaped(tag: str, where: str) -> None:
    """``cpu_seconds=1`` against 2 s of CPU in kernel-reaped children: exceeded, and counted (also as
    ``Resources.cpu_seconds``, whose RLIMIT_CPU per process never binds here)."""
    defaults = {"resources": cwa.Resources(cpu_seconds=1)} if where == "resources" else {}
    async with arena(tag, **defaults) as a:
        options = {"cpu_seconds": 1.0} if where == "request" else {}
        r = await a.victim.run_python(UNREAPED, timeout_seconds=HANG_GUARD_SECONDS, **options)
        assert r.cpu_exceeded and r.cpu_seconds >= 1.0, r


def can_set_oom_floors() -> bool:
    """Whether this process has CAP_SYS_RESOURCE (24), which the kernel's OOM score floor needs."""
    with open("/proc/self/status") as f:
        eff = next(int(line.split()[1], 16) for line in f if line.startswith("CapEff:"))
    return bool(eff >> 24 & 1)


@pytest.mark.skipif(not can_set_oom_floors(), reason="needs a driver with CAP_SYS_RESOURCE (SECURITY.md)")
async def test_no_command_can_lower_its_oom_score(tag: str) -> None:
    """A host out of memory must pick sandboxes first: a command cannot lower its score, nor PID 1's."""
    lower = (
        "import errno\n"
        "for path in ('/proc/self/oom_score_adj', '/proc/1/oom_score_adj'):\n"
        "    try:\n"
        "        with open(path, 'w') as f:\n"
        "            f.write('0')\n"
        "        print(path, 'lowered')\n"
        "    except OSError as e:\n"
        "        print(path, errno.errorcode[e.errno])\n"
        "print(open('/proc/self/oom_score_adj').read().strip())\n"
    )
    async with arena(tag) as a:
        for run in (a.victim.run_python, lambda src, **kw: a.victim.exec(["python3", "-I", "-c", src], **kw)):
            r = await run(lower, timeout_seconds=HANG_GUARD_SECONDS)
            lines = r.stdout.splitlines()
            assert r.returncode == 0 and lines[-1] == "1000", r
            assert not any(line.endswith("lowered") for line in lines), r
        assert (await anyio.Path(f"/proc/{a.host_pid(a.victim)}/oom_score_adj").read_text()).strip() == "1000"


HOG_INOTIFY = (
    "import ctypes, time\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "held = []\n"
    "while len(held) < 1000:\n"
    "    fd = libc.inotify_init1(0)\n"
    "    if fd < 0:\n"
    "        break\n"
    "    held.append(fd)\n"
    "print(len(held), flush=True)\n"
    "time.sleep(30)\n"
)


def inotify_instances(n: int) -> int:
    """How many of ``n`` inotify instances this process could create (all closed again)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fds = []
    try:
        for _ in range(n):
            fd = libc.inotify_init1(0)
            if fd < 0:
                break
            fds.append(fd)
        return len(fds)
    finally:
        for fd in fds:
            os.close(fd)


async def test_a_sandbox_cannot_exhaust_the_drivers_or_a_neighbours_per_user_limits(tag: str) -> None:
    """Inotify instances are counted per user at every level of nested user namespaces: a sandbox
    holding all it may still leaves the driver and the canary sandbox theirs."""
    async with (
        arena(tag) as a,
        a.victim.process(["python3", "-I", "-c", HOG_INOTIFY], timeout_seconds=HANG_GUARD_SECONDS) as hog,
    ):
        async for chunk in hog.stdout:
            held = int(chunk)
            break
        assert 0 < held <= 16
        assert inotify_instances(8) == 8  # the driver's own
        r = await a.canary.exec(["python3", "-I", "-c", HOG_INOTIFY.replace("time.sleep(30)", "")])
        assert int(r.stdout) == held  # the neighbour gets a full share of its own
        mq = await a.victim.exec(
            ["python3", "-I", "-c", "import resource; print(*resource.getrlimit(resource.RLIMIT_MSGQUEUE))"]
        )
        assert mq.stdout.split() == [str(64 << 10)] * 2


async def test_a_module_planted_in_the_working_directory_is_not_imported_by_run_python(tag: str) -> None:
    """An earlier tool call plants ``/workspace/json.py`` (and ``colorsys.py``: ``json`` is already
    loaded in the warm interpreter); a later program's import gets the standard library's, and so do
    the Pythons it starts, unless the caller asks for the working directory (``PYTHONSAFEPATH=""``)."""
    async with arena(tag) as a:
        for name in ("json", "colorsys"):
            await a.victim.write_file(f"/workspace/{name}.py", b"print('planted')\n")
        r = await a.victim.run_python(
            "import colorsys, json\nprint(json.dumps([1]))", timeout_seconds=HANG_GUARD_SECONDS
        )
        assert (r.returncode, r.stdout) == (0, "[1]\n"), r
        r = await a.victim.run_python(
            "import subprocess\nsubprocess.run(['python3', '-c', 'import json; print(json.dumps(2))'])",
            timeout_seconds=HANG_GUARD_SECONDS,
        )
        assert r.stdout == "2\n", r
        asked = await a.victim.run_python(
            "import colorsys", timeout_seconds=HANG_GUARD_SECONDS, env={"PYTHONSAFEPATH": ""}
        )
        assert asked.stdout == "planted\n", asked


#: A wrong answer, then a crowd of busy tasks (200 threads, and 24 forked busy loops with their own
#: threads) competing with PID 1 for the sandbox's CPU while its timeout comes.
CPU_CROWD = (
    "import os, threading\n"
    "def spin():\n"
    "    while True:\n"
    "        pass\n"
    "for _ in range(24):\n"
    "    if os.fork() == 0:\n"
    "        for _ in range(3):\n"
    "            threading.Thread(target=spin, daemon=True).start()\n"
    "        spin()\n"
    "for _ in range(120):\n"
    "    threading.Thread(target=spin, daemon=True).start()\n"
    "spin()\n"
)


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy since boot (``/proc/stat``, every CPU)."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in f.readline().split()[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def assert_starved_only_if_others_held_the_machine(starved: bool, busy: float, own: float, wall: float) -> None:
    """A starved verdict (infrastructure: not scored) needs what the crowd cannot make: the machine's
    CPUs held by work outside its sandbox. ``busy`` is the machine's busy CPU over a window that holds
    the run, measured here, apart from the backend; ``own`` what the sandbox used, ``wall`` the run's.
    The backend asks for 75% of the capacity the sandbox left; this window is wider, so half is
    asked here. Not starved needs no evidence: the program's own timeout is always a true verdict."""
    if starved:
        left = len(os.sched_getaffinity(0)) * wall - own
        assert busy - own >= 0.5 * left, ("starved on an idle machine", busy, own, wall)


async def test_a_cpu_crowd_cannot_make_the_supervisor_report_late(tag: str) -> None:
    """PID 1 is in its own CPU group beside the commands' (one entity however many tasks they run):
    it reports the timeout itself, a result with the program's timeout. Infrastructure only if the
    machine was held by others (a loaded machine starves the crowd's group as it would any program's:
    checked against this test's own reading of the machine), never by the crowd's own doing.

    How late the report comes is a latency, and depends on the machine's load (here: 6 ms after
    the timeout for one busy loop, 3.6 s for the crowd with a Go build beside it), so it is not
    asserted here; the Sandbox layer's own deadline is set far off (120 s) so that it never
    decides the outcome. Both latencies are in the assertion message."""
    session = cwa.Session(
        cwa.SandboxDefaults(tags=(tag,)),
        backend="local",
        timeouts=cwa.Timeouts(exec_grace_seconds=120),
        handle_signals=False,
    )

    async def lateness(code: str) -> tuple[float, cwa.SandboxTimeoutError, float]:
        t0, busy0 = time.monotonic(), machine_busy_seconds()
        with pytest.raises(cwa.SandboxTimeoutError) as info:
            await sb.run_python(code, timeout_seconds=3)
        return time.monotonic() - t0 - 3, info.value, machine_busy_seconds() - busy0

    async with session as s:
        with anyio.fail_after(HANG_GUARD_SECONDS):
            sb = await s.sandbox()
        baseline, _, _ = await lateness("while True:\n    pass\n")
        for _ in range(2):
            late, err, busy = await lateness(CPU_CROWD)
            r = err.result
            assert r is not None and r.timed_out, (err, late, baseline)  # PID 1 reported it
            assert err.infrastructure == r.starved, (err, late, baseline)
            own = max(r.cpu_seconds, r.sandbox_cpu_seconds or 0.0)
            assert_starved_only_if_others_held_the_machine(r.starved, busy, own, r.wall_seconds)
        assert (await sb.exec(["echo", "alive"])).stdout == "alive\n"


async def test_a_cpu_crowd_scores_zero_not_none() -> None:
    """Through ``code_reward``: the wrong answer with the crowd is 0.0, and None (not scored) only
    where the machine was held by others while it ran (see above), never by the crowd's doing."""
    reward = code_reward(tests_column="tests", pool_size=0, timeout_seconds=3, verbose=False)
    busy0 = machine_busy_seconds()
    try:
        with anyio.fail_after(HANG_GUARD_SECONDS):
            rewards = await reward(
                completions=[f"<answer>\ndef solve(): return 41\n{CPU_CROWD}</answer>"],
                tests=["assert solve() == 42\n"],
            )
    finally:
        await reward.aclose()
    busy = machine_busy_seconds() - busy0
    (v,) = reward.last_verdicts
    starved = v.kind is VerdictKind.STARVED
    assert rewards == ([None] if starved else [0.0]), v
    assert v.wall_seconds is not None and v.cpu_seconds is not None, v
    assert_starved_only_if_others_held_the_machine(starved, busy, v.cpu_seconds, v.wall_seconds)
