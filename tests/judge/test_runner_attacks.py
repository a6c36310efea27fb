"""What a program may try against the runner that judges it in the same sandbox, and what it gets.

Each test is the attack a protection stops; removing the protection makes it fail (see docs/judge.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

import pytest

import cwsandbox_async as cwa
from cwsandbox_async.judge import Judge, Limits, TestCase, Verdict, get_language

LIMITS = Limits(time_seconds=0.5, memory_mib=128)


@pytest.fixture(scope="module")
async def sb(local_session: cwa.Session) -> AsyncIterator[cwa.Sandbox]:
    async with local_session.sandbox() as sandbox:
        yield sandbox


# Case 0 forges the runner's report of case 1 (accepted, with the expected "5") into the runner's own
# stdout, through /proc/<runner>/fd/1; case 1 itself only sleeps (a time limit).
FORGER = r"""
import base64, json, os, sys, time
if input() == "forge":
    line = {"i": 1, "exit": 0, "cpu": 0.01, "wall": 0.01, "rss": 1, "killed": None, "wait": 0.0, "oom": False,
            "out": base64.b64encode(b"5\n").decode(), "err": ""}
    try:
        with open("/proc/%d/fd/1" % os.getppid(), "w") as f:
            f.write(json.dumps(line) + "\n" + '{"done": true}\n')
        print("forged")
    except OSError as exc:
        print("blocked", type(exc).__name__)
else:
    time.sleep(600)
"""


async def test_a_case_cannot_write_into_the_runners_report(local_session: cwa.Session, sb: cwa.Sandbox) -> None:
    """The runner makes itself non-dumpable; the local sandbox also denies this on its own."""
    judge = Judge(local_session, limits=LIMITS)
    cases = [TestCase("forge\n", "x\n"), TestCase("sleep\n", "5\n")]
    result = await judge.judge(FORGER, "python", cases, sandbox=sb)
    assert result.cases[0].stdout.startswith("blocked"), result.cases[0]
    assert result.cases[1].verdict is Verdict.TIME_LIMIT


# Case 0 leaves a daemon behind (double fork, new session) and records its pid; case 1 reports
# whether it is still alive. Every process of a case is killed before the next one starts.
DAEMON = r"""
import os, sys, time
if input() == "leave":
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            time.sleep(600)
        os._exit(0)
    time.sleep(0.2)
    pids = [p for p in os.listdir("/proc") if p.isdigit()]
    pids = [p for p in pids if open("/proc/%s/cmdline" % p, "rb").read().startswith(b"python3")]
    open("/tmp/daemon.pid", "w").write(" ".join(pids))
    print("left")
else:
    alive = []
    for pid in open("/tmp/daemon.pid").read().split():
        if int(pid) != os.getpid() and int(pid) != os.getppid():
            try:
                state = open("/proc/%s/stat" % pid).read().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    alive.append(pid)
            except OSError:
                pass
    print("alive" if alive else "gone")
"""


async def test_nothing_of_a_case_survives_into_the_next(local_session: cwa.Session, sb: cwa.Sandbox) -> None:
    judge = Judge(local_session, limits=LIMITS)
    result = await judge.judge(
        DAEMON, "python", [TestCase("leave\n", "left\n"), TestCase("check\n", "gone\n")], sandbox=sb
    )
    assert [c.verdict for c in result.cases] == [Verdict.ACCEPTED, Verdict.ACCEPTED], result.cases


async def test_killing_the_runner_is_the_programs_failure(local_session: cwa.Session, sb: cwa.Sandbox) -> None:
    killer = "import os, signal\nprint(5)\nos.kill(os.getppid(), signal.SIGKILL)\n"
    judge = Judge(local_session, limits=LIMITS)
    result = await judge.judge(killer, "python", [TestCase("", "5\n"), TestCase("", "5\n")], sandbox=sb)
    assert [c.verdict for c in result.cases] == [Verdict.RUNTIME_ERROR, Verdict.SKIPPED]
    assert result.score == 0.0 and not result.infrastructure


async def test_stopping_the_runner_is_refused_and_scores_zero(local_session: cwa.Session, sb: cwa.Sandbox) -> None:
    """The sandbox's filter refuses every stop signal (``seccomp`` item 6): the program's own
    ``PermissionError`` is its verdict, never infrastructure, and the run goes on to score it."""
    stopper = "import os, signal\nos.kill(os.getppid(), signal.SIGSTOP)\n"
    judge = Judge(local_session, limits=Limits(time_seconds=0.2, memory_mib=128, wall_extra_seconds=0.2))
    # No compile step: the exec's deadline is then the cases' wall limits plus the runner's slack only.
    python = dataclasses.replace(get_language("python"), name="python-uncompiled", compile=None)
    result = await judge.judge(stopper, python, [TestCase("", "5\n")], sandbox=sb)
    assert [c.verdict for c in result.cases] == [Verdict.RUNTIME_ERROR]
    assert "PermissionError" in result.cases[0].stderr_tail, result.cases[0]
    assert result.score == 0.0


async def test_a_fork_bomb_is_contained_and_the_next_case_runs(local_session: cwa.Session, sb: cwa.Sandbox) -> None:
    bomb = "import os\nif input() == 'bomb':\n    while True:\n        try: os.fork()\n        except OSError: pass\n"
    bomb += "print(5)\n"
    judge = Judge(local_session, limits=LIMITS)
    result = await judge.judge(bomb, "python", [TestCase("bomb\n", "5\n"), TestCase("ok\n", "5\n")], sandbox=sb)
    assert result.cases[0].verdict in (Verdict.TIME_LIMIT, Verdict.MEMORY_LIMIT)
    assert result.cases[1].verdict is Verdict.ACCEPTED


async def test_a_sandbox_killed_from_outside_is_not_scored(local_session: cwa.Session) -> None:
    """The platform's failure (the sandbox's process killed from the host mid-judgement): no verdict, no score."""
    import os
    import signal

    import anyio

    judge = Judge(local_session, limits=Limits(time_seconds=2, memory_mib=128))
    async with local_session.sandbox() as box:
        await judge.check_toolchains(["python"], sandbox=box)
        pid = local_session.backend._boxes[box.sandbox_id].pid  # type: ignore[attr-defined]

        async def kill_soon() -> None:
            await anyio.sleep(0.5)
            os.kill(pid, signal.SIGKILL)

        async with anyio.create_task_group() as tg:
            tg.start_soon(kill_soon)
            result = await judge.judge(
                "import time\ntime.sleep(1.5)\nprint(1)\n", "python", [TestCase("", "1\n")] * 2, sandbox=box
            )
    assert [c.verdict for c in result.cases] == [Verdict.INFRASTRUCTURE] * 2, result.cases
    assert result.score is None and result.infrastructure
