"""Verdict integrity of the bundled rewards: a pass needs the tests to have run to their end.

Every early-exit hack scores 0.0 and the correct solution 1.0, through ``code_reward``
and the ART tools' ``submit_solution``, on the local and the fake backends. The
harness's own guarantees (the marker is unknown to the program, and the marker is
what the verdict rests on) are tested on the local backend, where the program runs
in a sandbox as in training.
"""

from __future__ import annotations

import json
import os
from typing import Any

import anyio
import pytest
from guards import HANG_GUARD_SECONDS

from cwsandbox_async import (
    ExecResult,
    SandboxBackendUnavailableError,
    SandboxDefaults,
    SandboxFileError,
    SandboxNotRunningError,
    SandboxTerminatedError,
    SandboxTimeoutError,
    SandboxValidationError,
    Session,
)
from cwsandbox_async.backends.base import Backend
from cwsandbox_async.integrations._harness import MARKER_PREFIX, harness_run
from cwsandbox_async.integrations._run import run_python
from cwsandbox_async.integrations.art import run_tool
from cwsandbox_async.integrations.trl import code_reward
from cwsandbox_async.testing import FakeBackend

from .conftest import fake

RIGHT = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return a - b\n"
TESTS = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n"

#: Completions that end the process before (or instead of) their tests, each with a wrong ``add``.
EARLY_EXITS = {
    "os._exit(0) first": "import os\nos._exit(0)\n" + WRONG,
    "sys.exit(0) first": "import sys\nsys.exit(0)\n" + WRONG,
    "raise SystemExit(0) first": "raise SystemExit(0)\n" + WRONG,
    "atexit exits 0 after failed tests": "import atexit, os\natexit.register(os._exit, 0)\n" + WRONG,
    "atexit exits 0 instead of the tests": "import atexit, os, sys\natexit.register(os._exit, 0)\nsys.exit(1)\n",
    "os._exit(0) when called": "def add(a, b):\n    import os\n    os._exit(0)\n",
    "sys.exit(0) when called": "def add(a, b):\n    raise SystemExit(0)\n",
    "a thread exits 0 mid-test": (
        "import os, threading, time\n"
        "def add(a, b):\n"
        "    threading.Thread(target=os._exit, args=(0,)).start()\n"
        "    time.sleep(5)\n"
    ),
    "prints a made-up marker": f"print({(MARKER_PREFIX + b'0' * 32).decode()!r})\nimport os\nos._exit(0)\n",
    "echoes its stdin": "import os, sys\nsys.stdout.write(sys.stdin.read())\nos._exit(0)\n",
    "replaces exec and compile": "import builtins, os\nbuiltins.exec = builtins.compile = lambda *a, **k: None\n"
    + WRONG,
}


def answer(code: str) -> str:
    return f"<answer>\n{code}</answer>"


async def test_code_reward_early_exit_scores_zero_and_correct_scores_one(program_backend: Backend | str) -> None:
    names = ["correct", "wrong", *EARLY_EXITS]
    codes = [RIGHT, WRONG, *EARLY_EXITS.values()]
    reward = code_reward(tests_column="tests", pool_size=0, verbose=False, backend=program_backend)
    try:
        with anyio.fail_after(HANG_GUARD_SECONDS):
            rewards = await reward(completions=[answer(c) for c in codes], tests=[TESTS] * len(codes))
    finally:
        await reward.aclose()
    assert dict(zip(names, rewards, strict=True)) == {"correct": 1.0, "wrong": 0.0, **dict.fromkeys(EARLY_EXITS, 0.0)}


async def test_code_reward_without_tests_needs_the_program_to_run_to_its_end(program_backend: Backend | str) -> None:
    codes = ["print('done')", "import os\nos._exit(0)\nprint('done')", "import sys\nprint('x')\nsys.exit(0)"]
    reward = code_reward(pool_size=0, verbose=False, backend=program_backend)
    try:
        with anyio.fail_after(HANG_GUARD_SECONDS):
            assert await reward(completions=[answer(c) for c in codes]) == [1.0, 0.0, 0.0]
    finally:
        await reward.aclose()


def submit(code: str) -> dict[str, Any]:
    return {
        "id": "s1",
        "type": "function",
        "function": {"name": "submit_solution", "arguments": json.dumps({"code": code})},
    }


async def test_submit_solution_early_exit_fails(program_backend: Backend | str) -> None:
    async with Session(backend=program_backend) as session, session.sandbox() as sb:
        with anyio.fail_after(HANG_GUARD_SECONDS):
            good = await run_tool(sb, submit("print('working')\n" + RIGHT), tests=TESTS)
            assert good.passed is True and good.observation == "All tests passed."
            for name, code in EARLY_EXITS.items():
                res = await run_tool(sb, submit(code), tests=TESTS, timeout_seconds=HANG_GUARD_SECONDS)
                assert res.submitted and res.passed is False, name
                assert res.observation.startswith("Tests failed."), name
                assert MARKER_PREFIX.decode() not in res.observation or name == "prints a made-up marker", name
            exited = await run_tool(sb, submit("import sys\nsys.exit(0)\n"), tests=TESTS)
            assert "ended the process (SystemExit(0)) before its tests finished" in exited.observation
            failed = await run_tool(sb, submit("print('trying')\n" + WRONG), tests=TESTS)
            why = "Tests failed. Wrong answer: AssertionError at tests.py line 1: assert add(2, 3) == 5\n"
            assert failed.observation.startswith(why) and "\ntrying\n" in failed.observation
            assert 'File "tests.py", line 1' in failed.observation
            assert failed.verdict is not None and failed.verdict.kind == "wrong_answer"


# -- the harness itself -----------------------------------------------------------------------


def result_of(stdout: bytes, **kw: Any) -> ExecResult:
    fields: dict[str, Any] = {"returncode": 0, "stderr_bytes": b"", "wall_seconds": 0.1, "cpu_seconds": 0.1}
    fields.update(kw)
    return ExecResult(command=("python3",), stdout_bytes=stdout, **fields)


def test_passed_needs_exit_zero_no_kill_and_the_marker_last() -> None:
    run = harness_run(RIGHT, TESTS)
    good = b"out\n\n" + run.marker + b"\n"
    assert run.passed(result_of(good))
    assert run.output(result_of(good)) == "out\n"
    for bad in (
        result_of(good, returncode=1),
        result_of(good, timed_out=True),
        result_of(good, truncated=True),
        result_of(good, oom_killed=True),
        result_of(good, cpu_exceeded=True),
        result_of(good + b"later output\n"),
        result_of(b"\n" + run.marker),
        result_of(b"\n" + harness_run(RIGHT, TESTS).marker + b"\n"),  # another run's marker
    ):
        assert not run.passed(bad)
    assert harness_run(RIGHT, TESTS).marker != run.marker
    assert run.marker not in run.source.encode()  # the constant harness holds no secret


@pytest.fixture
async def local_sandbox(local_only: None) -> Any:
    async with Session(backend="local") as session, session.sandbox() as sb:
        yield sb


#: Looks for the marker everywhere a program can read without introspecting its own interpreter,
#: prints all it found, then exits 0.
SNOOP = r"""
import os, sys
found = [sys.stdin.read(), repr(sys.argv), repr(dict(os.environ))]
for fd in [0] + [int(n) for n in os.listdir("/proc/self/fd")]:
    try:
        found.append(repr(os.pread(fd, 1 << 16, 0)))
    except OSError:
        pass
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    for name in ("cmdline", "environ"):
        try:
            found.append(repr(open(f"/proc/{pid}/{name}", "rb").read()))
        except OSError:
            pass
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                opened = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK)
                found.append(repr(os.read(opened, 1 << 16)))
                os.close(opened)
            except OSError:
                pass
    except OSError:
        pass
for top in ("/tmp", "/workspace", os.getcwd(), "/dev/shm"):
    for root, _, files in os.walk(top):
        for f in files:
            try:
                opened = os.open(os.path.join(root, f), os.O_RDONLY | os.O_NONBLOCK)
                found.append(repr(os.read(opened, 1 << 20)))
                os.close(opened)
            except OSError:
                pass
print("\n".join(found))
print("searched", len(found), "places", flush=True)
os._exit(0)
"""


async def test_the_marker_is_nowhere_the_program_can_read(local_sandbox: Any) -> None:
    await local_sandbox.write_file("/tmp/planted.txt", "PLANTED-IN-A-FILE")
    run = harness_run(SNOOP, TESTS)
    result = await local_sandbox.run_python(
        run.source, stdin=run.stdin, env={"PLANTED": "PLANTED-IN-THE-ENV"}, timeout_seconds=HANG_GUARD_SECONDS
    )
    assert "searched" in result.stdout and result.returncode == 0, result.stderr
    assert "PLANTED-IN-A-FILE" in result.stdout and "PLANTED-IN-THE-ENV" in result.stdout  # the search works
    assert run.marker not in result.stdout_bytes
    assert MARKER_PREFIX not in result.stdout_bytes  # not even the header it came in
    assert not run.passed(result)


async def test_the_verdict_rests_on_the_marker(local_sandbox: Any) -> None:
    """A program that knew this run's marker would pass: the secret is what the verdict rests on."""
    run = harness_run(WRONG, TESTS)
    forger = harness_run(f"import os\nos.write(1, b'\\n' + {run.marker!r} + b'\\n')\nos._exit(0)\n", TESTS)
    stdin = forger.stdin.replace(forger.marker, run.marker)  # the forger's program, this run's marker
    forged = await run_python(local_sandbox, forger.source, stdin=stdin, timeout_seconds=HANG_GUARD_SECONDS)
    assert run.passed(forged)
    honest = await run_python(local_sandbox, run.source, stdin=run.stdin, timeout_seconds=HANG_GUARD_SECONDS)
    assert not run.passed(honest)


async def test_a_program_that_takes_its_sandbox_down_scores_zero_a_platform_failure_none() -> None:
    """Non-infrastructure errors are the program's outcome (0.0); infrastructure ones are not scored."""

    def handler(error: BaseException) -> Any:
        async def run(argv: tuple[str, ...], stdin: bytes, files: dict[str, bytes]) -> tuple[int, bytes, bytes]:
            raise error

        return run

    own = SandboxNotRunningError("the program killed its agent", infrastructure=False)
    platform = SandboxNotRunningError("the node went away", infrastructure=True)
    for error, expected in ((own, [0.0]), (platform, [None])):
        backend = fake()
        backend.exec_handler = handler(error)
        reward = code_reward(pool_size=0, verbose=False, backend=backend)
        try:
            assert await reward(completions=[answer(RIGHT)]) == expected
        finally:
            await reward.aclose()


@pytest.mark.parametrize(
    "error",
    [
        SandboxTerminatedError("sandbox was stopped"),  # exec after stop(): the caller's
        SandboxBackendUnavailableError("the backend is closed", infrastructure=False),  # the caller's
        SandboxValidationError("bad input"),
        KeyError("a backend bug"),
    ],
    ids=lambda e: type(e).__name__,
)
async def test_a_caller_mistake_or_a_bug_is_raised_not_scored(error: BaseException) -> None:
    backend = fake()

    async def failing(argv: tuple[str, ...], stdin: bytes, files: dict[str, bytes]) -> tuple[int, bytes, bytes]:
        raise error

    backend.exec_handler = failing
    reward = code_reward(pool_size=0, verbose=False, backend=backend)
    try:
        with pytest.raises(type(error)):
            await reward(completions=[answer(RIGHT), answer(WRONG)])
        stats = reward.last_stats
        assert stats is not None and stats.sandboxes == 2 and stats.infra_failures == 0
    finally:
        await reward.aclose()
    assert backend.live == 0


#: Wrong answers that try to turn their failure into a platform failure (memory limit: 256 MiB).
SABOTAGE = {
    "pins SysV shared memory": (
        "import ctypes, ctypes.util\n"
        "libc = ctypes.CDLL(ctypes.util.find_library('c'))\n"
        "libc.shmat.restype = ctypes.c_void_p\n"
        "for _ in range(16):\n"
        "    sid = libc.shmget(0, ctypes.c_size_t(128 << 20), 0o1600)\n"
        "    addr = libc.shmat(sid, None, 0)\n"
        "    if sid >= 0 and addr not in (None, ctypes.c_void_p(-1).value):\n"
        "        ctypes.memset(addr, 1, 128 << 20)\n" + WRONG
    ),
    "allocates 2 GiB": "x = bytearray(2 << 30)\n" + WRONG,
    "kills every process it can": "import os\nos.kill(-1, 9)\n" + WRONG,
    "kills its parent": "import os, time\nos.kill(os.getppid(), 9)\ntime.sleep(1)\n" + WRONG,
}


async def test_sabotage_scores_zero_never_none(local_only: None) -> None:
    """A wrong answer that fills memory or kills what it can reach is scored 0.0, not "not scored"."""
    reward = code_reward(tests_column="tests", pool_size=0, verbose=False, defaults={"resources": {"memory_mib": 256}})
    try:
        with anyio.fail_after(HANG_GUARD_SECONDS):
            rewards = await reward(completions=[answer(c) for c in SABOTAGE.values()], tests=[TESTS] * len(SABOTAGE))
    finally:
        await reward.aclose()
    assert dict(zip(SABOTAGE, rewards, strict=True)) == dict.fromkeys(SABOTAGE, 0.0)


async def test_submit_after_sabotage_is_a_failed_submission_not_a_platform_failure(local_only: None) -> None:
    """The episode pinned memory / killed processes with execute_code; its submission is still judged."""
    async with Session(backend="local", defaults={"resources": {"memory_mib": 256}}) as session:
        for name, code in SABOTAGE.items():
            async with session.sandbox() as sb:
                for _ in range(3):
                    await run_tool(sb, {"name": "execute_code", "arguments": json.dumps({"code": code})})
                res = await run_tool(sb, submit(WRONG), tests=TESTS)
                assert res.submitted and res.passed is False, name


#: A busy loop that keeps its own CPU time (not its children's) in /tmp/main-cpu, every 10 ms of it.
SELF_CPU = (
    "import os, time\n"
    "mark = 0.0\n"
    "while True:\n"
    "    if time.process_time() >= mark:\n"
    "        with open('/tmp/main-cpu.new', 'w') as f:\n"
    "            f.write(repr(time.process_time()))\n"
    "        os.replace('/tmp/main-cpu.new', '/tmp/main-cpu')\n"
    "        mark = time.process_time() + 0.01\n"
)

BUSY = "import time\nend = time.process_time() + 1.0\nwhile time.process_time() < end:\n    pass\n"


async def test_starved_programs_are_not_scored_a_sleeper_is(local_only: None) -> None:
    """Issue 13's case: many programs that each need 1 s of CPU, at once, with a 2.5 s timeout on a few cores."""
    async with Session(backend="local") as session, session.sandbox() as sb:
        with pytest.raises(SandboxTimeoutError) as info:
            await sb.run_python("import time\ntime.sleep(30)", timeout_seconds=1)
        sleeper = info.value.result
        assert sleeper is not None
        if sleeper.cpu_wait_seconds is None or sleeper.sandbox_cpu_seconds is None:
            pytest.skip("the local backend does not measure run-queue wait and sandbox CPU here")
        assert not info.value.infrastructure and not sleeper.starved  # it slept: its own timeout
    n = 8 * (os.cpu_count() or 2)  # about a quarter of a CPU each
    # no starved retries: this is the classification itself (the retry is tested in test_reward_verdicts)
    reward = code_reward(pool_size=0, limit=n, timeout_seconds=2.5, verbose=False, starved_retries=0)
    try:
        with anyio.fail_after(HANG_GUARD_SECONDS):
            rewards = await reward(completions=[answer(BUSY + RIGHT)] * n)
    finally:
        await reward.aclose()
    stats = reward.last_stats
    assert stats is not None
    # each got at most cores/n of a CPU: those that timed out were starved, and are not scored
    assert 0.0 not in rewards, rewards
    assert stats.starved == rewards.count(None) and stats.starved >= n // 2


@pytest.mark.parametrize("program_backend", ["fake", "kubernetes", "coreweave"], indirect=True)
async def test_the_submission_runs_alone(program_backend: Backend | str) -> None:
    """A process the episode left running cannot write into the submission's output: it is killed first."""
    async with Session(backend=program_backend) as session, session.sandbox() as sb:
        async with sb.process(["sh", "-c", "echo started; exec sleep 30"]) as leftover:
            with anyio.fail_after(HANG_GUARD_SECONDS):
                if isinstance(program_backend, FakeBackend):  # the fake streams output only at the end
                    while not program_backend.exec_in_flight:  # noqa: ASYNC110 - the fake's own counter
                        await anyio.sleep(0.01)
                else:
                    assert b"started" in await leftover.stdout.receive()
                res = await run_tool(sb, submit(RIGHT), tests=TESTS)
                assert res.passed is True
                ended = await leftover.wait()
        assert ended.returncode != 0  # killed, long before its 30 s


#: Busy daemons (double-forked out of the exec's process group) that make the main program wait for a CPU.
#: Each daemon leaves a mark; the main loop keeps its own CPU time in /tmp/main-cpu.
DAEMONS = (
    "import os, time\n"
    "for i in range(15):\n"
    "    if os.fork() == 0:\n"
    "        os.setsid()\n"
    "        if os.fork() == 0:\n"
    "            open(f'/tmp/daemon-{i}', 'w').close()\n"
    "            end = time.monotonic() + 8\n"
    "            while time.monotonic() < end:\n"
    "                pass\n"
    "        os._exit(0)\n" + SELF_CPU
)


async def test_its_own_busy_processes_never_make_a_timeout_starved(local_only: None) -> None:
    """The double-fork attack, and a busy process the episode started earlier in the same sandbox: they
    make the program wait for a CPU, but their CPU is the sandbox's, so they can never turn its timeout
    into "starved" while the sandbox as a whole got its share.

    What holds at any load is checked at any load: the attack ran (its 15 processes left their marks)
    and its CPU was counted (the sandbox used several times what the program's own loop used: that
    ratio is set by the 16 busy processes sharing the sandbox, not by the machine). Whether the sandbox
    as a whole got its share depends on what else the machine runs: only then is "not starved"
    asserted (inside evidence cannot tell an outside load from its own processes below that)."""
    burners = "for i in $(seq 15); do python3 -c 'while True: pass' & done; wait"
    share = SandboxDefaults().starved_cpu_share
    results: dict[str, tuple[ExecResult, float]] = {}

    async def timed_out(sb: Any, source: str) -> tuple[ExecResult, float]:
        with pytest.raises(SandboxTimeoutError) as info:
            await sb.run_python(source, timeout_seconds=2)
        assert info.value.result is not None
        own = await sb.exec(["cat", "/tmp/main-cpu"], timeout_seconds=HANG_GUARD_SECONDS)
        return info.value.result, float(own.stdout)

    async with Session(backend="local") as session:
        async with session.sandbox() as sb:
            results["daemons"] = await timed_out(sb, DAEMONS)
            marks = await sb.exec(["sh", "-c", "ls /tmp | grep -c '^daemon-'"], timeout_seconds=HANG_GUARD_SECONDS)
            assert marks.stdout.strip() == "15", marks
        async with session.sandbox() as sb, sb.process(["sh", "-c", burners], timeout_seconds=HANG_GUARD_SECONDS):
            with anyio.fail_after(HANG_GUARD_SECONDS):
                count = ["sh", "-c", "pgrep -c -f '^python3 -c while' || true"]
                while (await sb.exec(count)).stdout.strip() != "15":  # noqa: ASYNC110 - the sandbox's processes
                    await anyio.sleep(0.1)  # 15 busy processes of an earlier exec of this sandbox
            results["sibling"] = await timed_out(sb, SELF_CPU)
    if any(r.cpu_wait_seconds is None or r.sandbox_cpu_seconds is None for r, _ in results.values()):
        pytest.skip("the local backend does not measure run-queue wait and sandbox CPU here")
    for name, (r, own) in results.items():
        # counted in the exec's tree when the agent reaped the daemons, else in the sandbox's CPU
        used = max(r.cpu_seconds, r.sandbox_cpu_seconds or 0.0)
        assert used >= 2 * own, (name, own, r)
        if used >= share * r.wall_seconds:
            assert not r.starved, (name, own, r)


@pytest.mark.parametrize("program_backend", ["local", "kubernetes", "coreweave"], indirect=True)
async def test_a_fifo_planted_where_the_driver_reads_is_a_file_error_not_a_broken_transport(
    program_backend: Backend | str,
) -> None:
    """Reading or replacing a FIFO blocks until its deadline; that must not look like the platform failing."""
    async with Session(backend=program_backend) as session, session.sandbox() as sb:
        assert (await sb.exec(["mkfifo", "/tmp/trap"])).ok
        with anyio.fail_after(HANG_GUARD_SECONDS):
            with pytest.raises(SandboxFileError) as read:
                await sb.read_file("/tmp/trap", timeout_seconds=10)
            with pytest.raises(SandboxFileError) as write:
                await sb.write_file("/tmp/trap", b"data", timeout_seconds=10)
            tool = await run_tool(sb, {"name": "read_file", "arguments": json.dumps({"path": "/tmp/trap"})})
        assert not read.value.infrastructure and not write.value.infrastructure
        assert not tool.ok and tool.observation.startswith("Error: read_file failed")
        assert (await sb.exec(["true"])).ok  # the sandbox is fine
