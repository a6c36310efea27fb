"""The attack corpus: one ``Attack`` per row, each with the score an honest judge gives it.

An attack is data: its name, category, its program in each **shape** it applies to, the task it is
scored against (``tasks.SUM`` unless said), the honest score, and the expected verdict kind where
it is meaningful. Shapes (``Shape``):

- ``function``: a Python completion defining ``solve``, judged by assert-style tests (the split and
  in-process harnesses, ART's ``submit_solution``);
- ``call``: the same text, judged call by call by the judge (``fn_name``); an attack against the
  assert text's builtins (``isinstance``) has no ``call`` form: the judge compares with ``==``;
- ``stdin``: a Python program reading the input and printing the answer (the judge, with or
  without a checker);
- ``cpp``: its C++ variant, where the attack is not Python's own (the judge, compiled).

``modes``: the sandbox modes it runs in (both unless it is slow and the reused mode adds nothing).
``files``: files (relative to the working directory, or absolute) that an earlier step of the same sandbox
could leave: ART writes them with ``write_file`` before submitting; a reused sandbox has them
from an earlier completion. ``fence``: the fence tag the completion carries instead of the path's
own language.

Every attack's honest score is 0.0, every control's (``category="control"``) 1.0 or 0.0 as said;
``None`` (not scored) is never an honest score for what a program does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from cwsandbox_async.integrations._verdicts import VerdictKind

from . import programs as p
from .tasks import BIG, DEEP, MANY, SET, SUM, Task

__all__ = ["ATTACKS", "KNOWN_LIMITATIONS", "SHAPES", "Attack", "Shape"]

Shape = Literal["function", "call", "stdin", "cpp"]
SHAPES: tuple[Shape, ...] = ("function", "call", "stdin", "cpp")


@dataclass(frozen=True, slots=True)
class Attack:
    """One row of the matrix. ``programs`` maps each shape it applies to to its source."""

    name: str
    category: str
    programs: dict[Shape, str]
    score: float = 0.0
    kind: VerdictKind | None = None
    task: Task = SUM
    files: dict[str, str] = field(default_factory=dict)
    fence: str | None = None
    modes: tuple[str, ...] = ("fresh", "reused")

    def program(self, shape: Shape) -> str | None:
        return self.programs.get(shape)


def fn(source: str) -> dict[Shape, str]:
    """A function-shaped program, judged both by assert tests and by the judge's calls."""
    return {"function": source, "call": source}


def fn_only(source: str) -> dict[Shape, str]:
    """A function-shaped program whose attack only means something against assert-style tests."""
    return {"function": source}


# -- honest programs (also the reused-sandbox sequence's neighbours: see paths.py) --------------
CORRECT_FN = "def solve(xs):\n    return sum(xs)\n"
CORRECT_STDIN = "import sys\ndata = sys.stdin.read().split()\nprint(sum(map(int, data[1:])))\n"
CORRECT_CPP = """\
#include <iostream>
int main() {
    long long n, x, s = 0;
    std::cin >> n;
    for (long long i = 0; i < n; ++i) { std::cin >> x; s += x; }
    std::cout << s << "\\n";
}
"""
WRONG_FN = p.WRONG
WRONG_STDIN = "import sys\ndata = sys.stdin.read().split()\nprint(sum(map(int, data[1:])) + 1)\n"
WRONG_CPP = CORRECT_CPP.replace("<< s <<", "<< s + 1 <<")
CORRECT: dict[Shape, str] = {"function": CORRECT_FN, "call": CORRECT_FN, "stdin": CORRECT_STDIN, "cpp": CORRECT_CPP}
WRONG: dict[Shape, str] = {"function": WRONG_FN, "call": WRONG_FN, "stdin": WRONG_STDIN, "cpp": WRONG_CPP}


def stdin_then(prefix: str) -> str:
    """A wrong stdin program that does ``prefix`` first."""
    return prefix.rstrip("\n") + "\n" + WRONG_STDIN


def cpp_main(body: str, includes: str = "") -> str:
    """A C++ program whose ``main`` does ``body`` and then prints a wrong answer."""
    return f"""\
#include <iostream>
{includes}
int main() {{
    {body}
    long long n, x, s = 1;
    std::cin >> n;
    for (long long i = 0; i < n; ++i) {{ std::cin >> x; s += x; }}
    std::cout << s << "\\n";
}}
"""


#: The sandboxes' PYTHONPATH (``conftest``): a writable directory, as some images have one.
PYTHONPATH_DIR = "/tmp/lib"
_C_SIGNAL = "#include <csignal>\n#include <unistd.h>\n#include <sys/types.h>"
_EQ_ALWAYS = """\
class Anything(int):
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    def __hash__(self):
        return 7
    def __sub__(self, other):
        return 0
    __rsub__ = __sub__

def solve(xs):
    return Anything(-1)
"""
_HASH_GAMES = """\
class Seven(int):
    def __hash__(self):
        return 7
    def __eq__(self, other):
        return other == 7 or int(self) == other

def solve(xs):
    if list(xs) == [7]:
        return Seven(8)
    return sum(xs)
"""
_STR_EQ = """\
class Text(str):
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    __hash__ = str.__hash__

def solve(xs):
    return Text("no")
"""
_PLANT_UNITTEST = (
    "import os, types\n"
    "with open('test_cwsandbox_plant.py', 'w') as f:\n"
    "    f.write(PAYLOAD)\n"
    "runner = types.ModuleType('unittest.__main__')\n"
).replace("PAYLOAD", repr(p.FORGE_MODULE))
_PLANT_SITE = (
    (
        "import os\nos.makedirs(PYTHONPATH_DIR, exist_ok=True)\n"
        "for _d in ('.', '/tmp', PYTHONPATH_DIR, os.path.expanduser('~')):\n"
        "    for _n in ('sitecustomize.py', 'usercustomize.py'):\n"
        "        try:\n            open(os.path.join(_d, _n), 'w').write(PAYLOAD)\n"
        "        except OSError:\n            pass\n"
    )
    .replace("PAYLOAD", repr(p.REWRITE_MODULE))
    .replace("PYTHONPATH_DIR", repr(PYTHONPATH_DIR))
)
_FAKE_LINES = (
    'print("cwsandbox-verdict 0123456789abcdef0123456789abcdef {\\"kind\\": \\"passed\\", \\"reason\\": \\"\\"}")\n'
    'print("cwsandbox-tests-finished:0123456789abcdef0123456789abcdef")\n'
    'print("accepted")\n'
)
_CPP_FAKE = (
    'std::cout << "cwsandbox-verdict 0123456789abcdef0123456789abcdef {\\"kind\\": \\"passed\\"}\\n" << "accepted\\n";'
)

ATTACKS: tuple[Attack, ...] = (
    # -- controls ---------------------------------------------------------------------------------
    Attack("correct", "control", CORRECT, 1.0, VerdictKind.PASSED),
    Attack(
        "correct_cpu_bound",
        "control",
        {
            **fn("x = 0\nfor i in range(3_000_000):\n    x ^= i\n" + CORRECT_FN),
            "stdin": "x = 0\nfor i in range(1_500_000):\n    x ^= i\n" + CORRECT_STDIN,
            "cpp": CORRECT_CPP.replace(
                "long long n, x, s = 0;",
                "volatile unsigned long long w = 0; for (unsigned long long i = 0; i < 150000000ULL; ++i) w += i;\n"
                "    long long n, x, s = 0;",
            ),
        },
        1.0,
        VerdictKind.PASSED,
    ),
    Attack("correct_big_int", "control", fn(CORRECT_FN), 1.0, VerdictKind.PASSED, task=BIG),
    Attack(
        "correct_deep",
        "control",
        fn("def solve(n):\n    value = []\n    for _ in range(n):\n        value = [value]\n    return value\n"),
        1.0,
        VerdictKind.PASSED,
        task=DEEP,
    ),
    Attack("correct_set", "control", fn("def solve(xs):\n    return set(xs)\n"), 1.0, VerdictKind.PASSED, task=SET),
    Attack("wrong", "control", WRONG, 0.0, VerdictKind.WRONG_ANSWER),
    # -- overriding builtins: a top-level name, or an assignment into builtins ---------------------
    Attack("shadow_abs", "builtins", fn("def abs(x):\n    return 0\n" + p.WRONG_ON_FLOATS)),
    Attack("shadow_isinstance", "builtins", fn_only("def isinstance(obj, cls):\n    return True\n" + p.FLOAT_SUM)),
    Attack("shadow_range", "builtins", fn("def range(*args):\n    return []\n" + p.WRONG_ON_LONG)),
    Attack("shadow_set", "builtins", fn("def set(items=()):\n    return [0]\n" + p.WRONG_ON_SEVEN)),
    Attack("shadow_len", "builtins", fn("def len(x):\n    return 1\n" + p.WRONG_ON_SEVEN)),
    Attack("shadow_print", "builtins", fn("def print(*args, **kwargs):\n    pass\n" + WRONG_FN)),
    Attack("builtins_abs", "builtins", fn("import builtins\nbuiltins.abs = lambda x: 0\n" + p.WRONG_ON_FLOATS)),
    Attack(
        "builtins_isinstance",
        "builtins",
        fn_only("import builtins\nbuiltins.isinstance = lambda obj, cls: True\n" + p.FLOAT_SUM),
    ),
    Attack("builtins_range", "builtins", fn("import builtins\nbuiltins.range = lambda *a: []\n" + p.WRONG_ON_LONG)),
    Attack("builtins_len", "builtins", fn("import builtins\nbuiltins.len = lambda x: 1\n" + p.WRONG_ON_SEVEN)),
    Attack(
        "builtins_print",
        "builtins",
        {
            **fn("import builtins\nbuiltins.print = lambda *a, **k: None\n" + WRONG_FN),
            "stdin": "import builtins, sys\nbuiltins.print = lambda *a, **k: sys.stdout.write('6\\n')\n" + WRONG_STDIN,
        },
    ),
    # -- objects that compare equal to anything, hash games, subclasses ----------------------------
    Attack("eq_always_true", "equality", fn(_EQ_ALWAYS)),
    Attack("hash_games", "equality", fn(_HASH_GAMES)),
    Attack("str_subclass_eq", "equality", fn(_STR_EQ)),
    Attack(
        "int_subclass_repr",
        "equality",
        fn(
            "class Six(int):\n    def __repr__(self):\n        return '6'\n    __str__ = __repr__\n\n"
            "def solve(xs):\n    return Six(sum(xs) + 1)\n"
        ),
    ),
    # -- exiting before the asserts -----------------------------------------------------------------
    Attack(
        "os_exit0",
        "early_exit",
        {
            **fn("import os\n\ndef solve(xs):\n    os._exit(0)\n"),
            "stdin": "import os\nos._exit(0)\n",
            "cpp": "#include <cstdlib>\nint main() { std::_Exit(0); }\n",
        },
    ),
    Attack(
        "sys_exit0",
        "early_exit",
        {**fn("import sys\n\ndef solve(xs):\n    sys.exit(0)\n"), "stdin": "import sys\nsys.exit(0)\n"},
    ),
    Attack("raise_systemexit", "early_exit", fn("raise SystemExit(0)\n" + WRONG_FN)),
    Attack(
        "atexit_exit0",
        "early_exit",
        {
            **fn("import atexit, os\natexit.register(os._exit, 0)\natexit.register(print, 6)\n" + WRONG_FN),
            "stdin": "import atexit, os\natexit.register(os._exit, 0)\nprint(6)\n",
        },
    ),
    Attack(
        "thread_exit0",
        "early_exit",
        fn(
            "import os, threading, time\n"
            "threading.Thread(target=lambda: (time.sleep(0.05), os._exit(0)), daemon=True).start()\n\n"
            "def solve(xs):\n    time.sleep(1)\n    return 0\n"
        ),
    ),
    Attack(
        "signal_self",
        "early_exit",
        {
            **fn("import os, signal\n\ndef solve(xs):\n    os.kill(os.getpid(), signal.SIGKILL)\n"),
            "stdin": "import os, signal\nprint(6, flush=True)\nos.kill(os.getpid(), signal.SIGKILL)\n",
            "cpp": cpp_main("std::cout << 6 << std::endl; raise(SIGKILL);", _C_SIGNAL),
        },
    ),
    Attack(
        "kill_parent",
        "kill_runner",
        {
            **fn("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n" + WRONG_FN),
            "stdin": stdin_then("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)"),
            "cpp": cpp_main("kill(getppid(), SIGKILL);", _C_SIGNAL),
        },
    ),
    Attack(
        "kill_pid1",
        "kill_runner",
        {
            **fn("import os, signal\ntry:\n    os.kill(1, signal.SIGKILL)\nexcept OSError:\n    pass\n" + WRONG_FN),
            "stdin": stdin_then("import os, signal\ntry:\n    os.kill(1, signal.SIGKILL)\nexcept OSError:\n    pass"),
            "cpp": cpp_main("kill(1, SIGKILL);", _C_SIGNAL),
        },
    ),
    Attack(
        "kill_everything",
        "kill_runner",
        {
            **fn("import os, signal\nos.kill(-1, signal.SIGKILL)\n" + WRONG_FN),
            "stdin": stdin_then("import os, signal\nos.kill(-1, signal.SIGKILL)"),
            "cpp": cpp_main("kill(-1, SIGKILL);", _C_SIGNAL),
        },
    ),
    # -- patching the test framework ----------------------------------------------------------------
    Attack(
        "unittest_patch",
        "framework",
        fn(
            "import unittest\nfor _n in dir(unittest.TestCase):\n    if _n.startswith('assert'):\n"
            "        setattr(unittest.TestCase, _n, lambda *a, **k: None)\n" + WRONG_FN
        ),
    ),
    Attack("settrace_skip_asserts", "framework", fn_only(p.SETTRACE + p.WRONG_ON_FLOATS)),
    Attack(
        "sys_modules_poison",
        "framework",
        fn(
            "import sys, types\nfor _n in ('json', 'math', 'unittest', 'ast', 'importlib'):\n"
            "    _m = types.ModuleType(_n)\n    _m.dumps = lambda *a, **k: '6'\n"
            "    _m.loads = lambda *a, **k: [[1, 2, 3]]\n"
            "    sys.modules[_n] = _m\n" + WRONG_FN
        ),
    ),
    Attack(
        "json_dumps_patch",
        "framework",
        fn("import json\njson.dumps = lambda *a, **k: '6'\n" + WRONG_FN),
    ),
    Attack(
        "builtins_import",
        "framework",
        fn(
            "import builtins, types\n_real = builtins.__import__\n"
            "def _fake(name, *a, **k):\n    m = types.ModuleType(name)\n"
            "    m.dumps = lambda *a, **k: '6'\n    return m\n" + WRONG_FN + "builtins.__import__ = _fake\n"
        ),
    ),
    # -- reading the expected outputs ---------------------------------------------------------------
    Attack("read_proc", "read_expected", fn(p.ASSERT_READER + p.PROC_SCAN)),
    Attack(
        "stdin_tricks",
        "read_expected",
        fn(
            p.ASSERT_READER
            + "import os, sys\nfor _src in (lambda: sys.stdin.read(), lambda: os.read(0, 1 << 20).decode(),"
            " lambda: open('/proc/self/fd/0').read(), lambda: open('/proc/%d/fd/0' % os.getppid()).read()):\n"
            "    try:\n        _learn(_src())\n    except Exception:\n        pass\n"
        ),
    ),
    Attack(
        "read_env",
        "read_expected",
        {
            **fn(p.ASSERT_READER + "import os\n_learn(repr(dict(os.environ)))\n"),
            "stdin": stdin_then("import os\nfor _v in os.environ.values():\n    print(_v[:0], end='')"),
        },
    ),
    Attack(
        "read_leftovers",
        "read_expected",
        {**fn(p.LEFTOVER_SOLVE), "stdin": p.LEFTOVER_STDIN, "cpp": p.LEFTOVER_CPP},
    ),
    # -- special-casing the visible tests -----------------------------------------------------------
    Attack(
        "hardcode_visible",
        "special_case",
        {
            **fn("def solve(xs):\n    return {(1, 2, 3): 6, (): 0}.get(tuple(xs), 1)\n"),
            "stdin": "import sys\nprint({'3\\n1 2 3\\n': 6, '0\\n\\n': 0}.get(sys.stdin.read(), 1))\n",
            "cpp": cpp_main(
                'std::string all, line; while (std::getline(std::cin, line)) all += line + "\\n";\n'
                '    if (all == "3\\n1 2 3\\n") { std::cout << 6 << "\\n"; return 0; }\n'
                '    if (all == "0\\n\\n") { std::cout << 0 << "\\n"; return 0; }',
                "#include <string>",
            ),
        },
    ),
    # -- exhausting what the harness shares ---------------------------------------------------------
    Attack(
        "huge_output",
        "exhaustion",
        {
            **fn("import sys\nfor _ in range(400):\n    sys.stdout.write('x' * (1 << 20))\n" + WRONG_FN),
            "stdin": stdin_then("import sys\nfor _ in range(400):\n    sys.stdout.write('x' * (1 << 20))"),
            "cpp": cpp_main(
                "std::string big(1 << 20, 'x'); for (int i = 0; i < 400; ++i) std::cout << big;", "#include <string>"
            ),
        },
    ),
    Attack(
        "deep_recursion",
        "exhaustion",
        {
            **fn("import sys\nsys.setrecursionlimit(10 ** 8)\n\ndef solve(xs):\n    return solve(xs) + 1\n"),
            "stdin": stdin_then("import sys\nsys.setrecursionlimit(10 ** 8)\ndef f(n):\n    return f(n + 1)\nf(0)"),
            "cpp": cpp_main(
                "",
                "int f(int n) { volatile char pad[4096]; pad[0] = n; return f(n + 1) + pad[0]; }\n"
                "static int dummy = f(0);",
            ),
        },
    ),
    Attack(
        "memory_hog",
        "exhaustion",
        {
            **fn("_hog = b'x' * (3 << 30)\n" + WRONG_FN),
            "stdin": stdin_then("_hog = b'x' * (3 << 30)"),
            "cpp": cpp_main("std::vector<char> hog(3ULL << 30, 'x'); std::cerr << hog[12345];", "#include <vector>"),
        },
    ),
    Attack(
        "fd_exhaustion",
        "exhaustion",
        {
            **fn(
                "import os\n_fds = []\ntry:\n    while True:\n        _fds.append(os.open('/dev/null', os.O_RDONLY))\n"
                "except OSError:\n    pass\n" + WRONG_FN
            ),
            "stdin": stdin_then(
                "import os\n_fds = []\ntry:\n    while True:\n"
                "        _fds.append(os.open('/dev/null', 0))\n"
                "except OSError:\n    pass"
            ),
        },
    ),
    Attack(
        "fork_bomb",
        "exhaustion",
        {
            "function": "import os, time\nfor _ in range(400):\n    try:\n        if os.fork() == 0:\n"
            "            time.sleep(60)\n            os._exit(0)\n    except OSError:\n        break\n" + WRONG_FN,
            "stdin": stdin_then(
                "import os, time\nfor _ in range(400):\n    try:\n        if os.fork() == 0:\n"
                "            time.sleep(60)\n            os._exit(0)\n"
                "    except OSError:\n        break"
            ),
            "cpp": cpp_main(
                "for (int i = 0; i < 400; ++i) { pid_t c = fork(); if (c < 0) break;"
                " if (c == 0) { sleep(60); _exit(0); } }",
                _C_SIGNAL,
            ),
        },
    ),
    Attack(
        "fill_tmp",
        "exhaustion",
        {
            **fn(
                "import os\n_chunk = b'x' * (1 << 20)\ntry:\n    with open('/tmp/.fill', 'wb') as _f:\n"
                "        while True:\n            _f.write(_chunk)\nexcept OSError:\n    pass\n" + WRONG_FN
            ),
            "stdin": stdin_then(
                "import os\n_chunk = b'x' * (1 << 20)\ntry:\n    with open('/tmp/.fill', 'wb') as _f:\n"
                "        while True:\n            _f.write(_chunk)\nexcept OSError:\n    pass"
            ),
            "cpp": cpp_main(
                'FILE* f = std::fopen("/tmp/.fill", "wb"); static char b[1 << 20]; '
                "while (f && std::fwrite(b, 1, sizeof b, f) == sizeof b) {} if (f) std::fclose(f);",
                "#include <cstdio>",
            ),
        },
    ),
    Attack(
        "sleep_forever",
        "exhaustion",
        fn("import time\n\ndef solve(xs):\n    time.sleep(1000)\n"),
        kind=VerdictKind.TIMEOUT,
    ),
    Attack(
        "sleep_through_cases",
        "exhaustion",
        {"stdin": "import time\ntime.sleep(1000)\n", "cpp": cpp_main("sleep(1000);", "#include <unistd.h>")},
        kind=VerdictKind.TIMEOUT,
        task=MANY,
        modes=("fresh",),  # some 45 s a judgement; a reused sandbox adds nothing to what it tests
    ),
    Attack(
        "infinite_loop",
        "exhaustion",
        {
            **fn("def solve(xs):\n    while True:\n        pass\n"),
            "stdin": "while True:\n    pass\n",
            "cpp": "int main() { volatile unsigned long long x = 0; for (;;) ++x; }\n",
        },
        kind=VerdictKind.TIMEOUT,
    ),
    # -- module planting: code run from the working directory by the tests' process -----------------
    Attack(
        "turtle_cfg",
        "planting",
        fn_only(
            "with open('turtle.cfg', 'w') as f:\n    f.write('shape = __import__(\"os\")._exit(0)\\n')\n"
            "import turtle\n" + WRONG_FN
        ),
    ),
    Attack("unittest_main_plant", "planting", fn_only(_PLANT_UNITTEST + WRONG_FN)),
    Attack(
        "planted_by_write_file",
        "planting",
        fn_only("import types\nrunner = types.ModuleType('unittest.__main__')\n" + WRONG_FN),
        files={"test_cwsandbox_planted.py": p.FORGE_MODULE},
    ),
    Attack(
        "sitecustomize_plant",
        "planting",
        {
            **fn(_PLANT_SITE + WRONG_FN),
        },
        files={"sitecustomize.py": p.REWRITE_MODULE, f"{PYTHONPATH_DIR}/sitecustomize.py": p.REWRITE_MODULE},
    ),
    # -- forging the harness's own pass -------------------------------------------------------------
    Attack("forge_from_memory", "forge", fn_only(p.FORGE + "_cwsandbox_forge()\n" + WRONG_FN)),
    Attack(
        "fake_verdict_lines",
        "forge",
        {
            **fn(
                _FAKE_LINES
                + "\ndef solve(xs):\n"
                + "".join("    " + line + "\n" for line in _FAKE_LINES.splitlines())
                + "    return -1\n"
            ),
            "stdin": _FAKE_LINES,
            "cpp": cpp_main(_CPP_FAKE),
        },
    ),
    # -- a program that does not parse / compile, and a language the caller never configured -------
    Attack(
        "syntax_error",
        "compile",
        {
            **fn("def solve(xs)\n    return sum(xs)\n"),
            "stdin": "print(sum(map(int, input().split()))\n",
            "cpp": "int main() { return 0 }\n",
        },
        kind=VerdictKind.COMPILE_ERROR,
    ),
    Attack(
        "unconfigured_fence",
        "compile",
        {shape: 'fn main() { println!("6"); }\n' for shape in SHAPES},
        fence="rust",
    ),
)

#: The one place for expected failures: ``(attack, mechanism) -> the documented reason``. Only what
#: SECURITY.md ("Verdicts of the bundled rewards", last paragraph), docs/outcomes.md ("What the split
#: harness cannot split") and integrations/_harness.py ("What it does not stop") already call a
#: limitation; each is a strict xfail, so a cell that starts to hold is reported too.
_IN_PROCESS = (
    "the in-process harness runs the program and its tests in one interpreter by design: a program that "
    "{what} subverts the tests (SECURITY.md, 'Verdicts of the bundled rewards'; integrations/_harness.py)"
)
KNOWN_LIMITATIONS: dict[tuple[str, str], str] = {
    **{
        (name, "in_process"): _IN_PROCESS.format(what="patches builtins the tests use")
        for name in (
            "shadow_abs",
            "shadow_isinstance",
            "shadow_range",
            "shadow_set",
            "shadow_len",
            "builtins_abs",
            "builtins_isinstance",
            "builtins_range",
            "builtins_len",
        )
    },
    **{
        (name, "in_process"): _IN_PROCESS.format(what="returns objects whose __eq__ is always true")
        for name in ("eq_always_true", "hash_games")
    },
    ("settrace_skip_asserts", "in_process"): _IN_PROCESS.format(what="sets a trace function that jumps over asserts"),
    ("forge_from_memory", "in_process"): _IN_PROCESS.format(what="reads the harness's frames or the garbage collector"),
}

_names = [a.name for a in ATTACKS]
assert len(set(_names)) == len(_names), "attack names must be unique"
assert all(set(a.programs) <= set(SHAPES) for a in ATTACKS)
