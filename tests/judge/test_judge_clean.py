"""A reused sandbox holds nothing of an earlier completion, and the checker works where the program cannot reach.

Each test judges a program that leaves things behind (its own files, files in every writable place,
a deep tree, an unwritable directory, a filled disk), then looks at the sandbox the way the next
completion (or the checker) would. Removing the runner's sweep (``sandboxed/sweep.py``), its
follow-up after a killed runner (``_runjob.sweep_after``), the checker's compile check before the
program, or the checker's "a failure after the program is the program's" rule makes one of these fail.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

import cwsandbox_async as cwa
from cwsandbox_async.judge import Checker, Judge, JudgeError, Limits, TestCase, Verdict
from cwsandbox_async.judge._checker import run_checker
from cwsandbox_async.judge._types import CaseResult

LIMITS = Limits(time_seconds=2.0, memory_mib=128)
ANY_ORDER = "import sys\ninp, out, ans = (open(p).read().split() for p in sys.argv[1:4])\n"
ANY_ORDER += "sys.exit(sorted(out) != sorted(ans))\n"

# Leaves files in every writable place, a deep tree, an unwritable directory, and (with a checker)
# tries to leave a trap where the judge's cache would go; then answers.
LITTERER = r"""
import os, sys
marks = []
for base in ("/tmp", "/workspace", "/dev/shm", os.getcwd()):
    p = os.path.join(base, "stash-%s.txt" % os.getpid())
    with open(p, "w") as f:
        f.write(open(sys.argv[0]).read() if os.path.exists(sys.argv[0]) else "x")
    marks.append(p)
deep = "/tmp/deep"
os.makedirs(deep, exist_ok=True)
d = deep
for i in range(300):
    d = os.path.join(d, "d")
    try:
        os.mkdir(d)
    except OSError:
        pass
os.makedirs("/workspace/locked/inner", exist_ok=True)
open("/workspace/locked/inner/f", "w").write("x")
os.chmod("/workspace/locked/inner", 0)
os.chmod("/workspace/locked", 0)
open("/tmp/cwsandbox-judge-cache", "w").write("trap")
print(sorted(input().split(), reverse=True)[0])
"""

# What the next completion sees: every entry of the writable places (none but the caller's file).
LOOKER = r"""
import os
found = []
for base in ("/tmp", "/workspace", "/dev/shm"):
    for root, dirs, files in os.walk(base):
        for name in dirs + files:
            path = os.path.join(root, name)
            if not path.startswith(os.getcwd()):
                found.append(path)
print(" ".join(sorted(found)) or "clean")
"""


@pytest.fixture
async def sb(local_session: cwa.Session) -> AsyncIterator[cwa.Sandbox]:
    async with local_session.sandbox() as sandbox:
        yield sandbox


async def look(judge: Judge, sb: cwa.Sandbox) -> str:
    result = await judge.judge(LOOKER, "python", [TestCase("", "clean\n")], sandbox=sb)
    return result.cases[0].stdout.strip()


async def test_the_next_completion_finds_nothing_of_the_last(local_session: cwa.Session, sb: cwa.Sandbox) -> None:
    """Sources, binaries, the program's files anywhere it could write: all gone; the caller's own file stays."""
    await sb.write_file("/workspace/caller.txt", "mine")
    judge = Judge(local_session, limits=LIMITS)
    first = await judge.judge(LITTERER, "python", [TestCase("1 3 2\n", "3\n")], sandbox=sb)
    assert first.score == 1.0 and first.clean, first
    cpp = '#include <cstdio>\nint main(){ std::FILE* f = std::fopen("/tmp/bin-stash", "w"); std::puts("3"); }\n'
    assert (await judge.judge(cpp, "cpp", [TestCase("", "3\n")], sandbox=sb)).score == 1.0
    assert await look(judge, sb) == "/workspace/caller.txt"
    assert (await sb.read_file("/workspace/caller.txt")) == b"mine"


async def test_a_program_that_kills_its_runner_is_swept_after(local_session: cwa.Session, sb: cwa.Sandbox) -> None:
    """The runner dies before its own sweep: the follow-up exec sweeps by time."""
    killer = "import os, signal\nopen('/tmp/left', 'w').write('x')\nos.makedirs('/dev/shm/a/b')\n"
    killer += "os.kill(os.getppid(), signal.SIGKILL)\n"
    judge = Judge(local_session, limits=LIMITS)
    result = await judge.judge(killer, "python", [TestCase("", "x\n"), TestCase("", "x\n")], sandbox=sb)
    assert result.cases[0].verdict is Verdict.RUNTIME_ERROR and result.score == 0.0
    assert result.clean
    assert await look(judge, sb) == "clean"


async def test_the_checker_runs_after_a_program_that_filled_the_disk(
    local_session: cwa.Session, sb: cwa.Sandbox
) -> None:
    """A full /tmp and /workspace, a file where a cache directory would go: the checker still decides."""
    filler = LITTERER + (
        "for base in ('/tmp', '/workspace'):\n"
        "    for i in range(4):  # 256 MiB a file at most (RLIMIT_FSIZE)\n"
        "        try:\n"
        "            with open(base + '/fill%d' % i, 'wb') as f:\n"
        "                while True: f.write(b'x' * (1 << 20))\n"
        "        except OSError:\n"
        "            pass\n"
    )
    judge = Judge(local_session, compare=Checker(ANY_ORDER), limits=Limits(time_seconds=5.0, memory_mib=128))
    result = await judge.judge(filler, "python", [TestCase("1 3 2\n", "3\n")], sandbox=sb)
    assert result.score == 1.0, result
    assert await look(Judge(local_session, limits=LIMITS), sb) == "clean"


async def test_a_checker_step_that_fails_after_the_program_is_its_zero(
    local_session: cwa.Session, sb: cwa.Sandbox
) -> None:
    """The checker's exec cannot even start (the sandbox is full): the checked cases are wrong answers."""
    checker = Checker(ANY_ORDER)
    judge = Judge(local_session, compare=checker, limits=LIMITS)
    for base in ("/workspace", "/tmp"):  # what a program could leave where the sweep cannot see
        fill = f"for i in 1 2 3 4; do cat /dev/zero > {base}/fill$i; done; true"  # 256 MiB a file at most
        await sb.exec(["sh", "-c", fill], timeout_seconds=60)
    case = TestCase("1 2\n", "2 1\n")
    pending = [CaseResult(0, "", Verdict.ACCEPTED, detail="to be checked")]
    results, _ = await run_checker(checker, sb, [case], pending, {0: b"1 2\n"}, judge)
    assert results[0].verdict is Verdict.WRONG_ANSWER
    assert "could not run after the program" in results[0].detail


async def test_a_checker_that_does_not_compile_raises_before_the_program_runs(
    local_session: cwa.Session, sb: cwa.Sandbox
) -> None:
    judge = Judge(local_session, compare=Checker("def broken(:\n"), limits=LIMITS)
    with pytest.raises(JudgeError, match="does not compile"):
        await judge.judge("open('/workspace/ran', 'w')\nprint(1)\n", "python", [TestCase("", "1\n")], sandbox=sb)
    assert await look(Judge(local_session, limits=LIMITS), sb) == "clean"


IPC_STASH = r"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
shm = libc.shmget(0x4832, 4096, 0o1600)  # IPC_CREAT | 0600
msg = libc.msgget(0x4833, 0o1600)
print("made" if shm >= 0 and msg >= 0 else "refused")
"""
IPC_LOOK = r"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
print("found" if libc.shmget(0x4832, 0, 0) >= 0 or libc.msgget(0x4833, 0) >= 0 else "clean")
"""


async def test_system_v_ipc_objects_do_not_outlive_their_completion(
    local_session: cwa.Session, sb: cwa.Sandbox
) -> None:
    judge = Judge(local_session, limits=LIMITS)
    made = await judge.judge(IPC_STASH, "python", [TestCase("", "made\n")], sandbox=sb)
    assert made.score == 1.0, made.cases[0]
    seen = await judge.judge(IPC_LOOK, "python", [TestCase("", "clean\n")], sandbox=sb)
    assert seen.cases[0].stdout.strip() == "clean"
