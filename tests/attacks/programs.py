"""Source snippets the corpus builds its programs from (kept apart so ``corpus.py`` reads as a table).

Every program here is a *completion*: what a policy could write. ``FORGE`` is the payload of the
attacks that try to forge a harness's pass from inside an interpreter that holds its secret: it
looks for the in-process harness's marker (``cwsandbox-tests-finished:<hex>``) or a 32-hex-digit
nonce (the split harness's) in the garbage collector's objects and the stack's frames, writes the
matching pass line to fd 1 and ends the process with status 0. Where the secret is not in the
interpreter it runs in, it finds nothing (or a stranger's hex string) and forges nothing useful.
"""

from __future__ import annotations

#: Defines ``_cwsandbox_forge()`` (see the module docstring); a program calls it where it wants.
FORGE = r"""
def _cwsandbox_forge():
    import gc, os, re, sys
    marker = re.compile(rb"cwsandbox-tests-finished:[0-9a-f]{32}")
    nonce = re.compile(rb"[0-9a-f]{32}")
    found = []
    def look(value):
        if isinstance(value, bytes) and len(value) < 1 << 16:
            hit = marker.search(value)
            if hit:
                found.insert(0, hit.group(0))
            elif nonce.fullmatch(value):
                found.append(value)
    for obj in gc.get_objects():
        if isinstance(obj, dict):
            for value in list(obj.values()):
                look(value)
        elif isinstance(obj, (list, tuple)):
            for value in obj:
                look(value)
    frame = sys._getframe()
    while frame is not None:
        for value in list(frame.f_locals.values()):
            look(value)
        frame = frame.f_back
    if not found:
        return
    secret = found[0]
    if secret.startswith(b"cwsandbox-tests-finished:"):
        line = b"\n" + secret + b"\n"
    else:
        line = b"\ncwsandbox-verdict " + secret + b' {"kind": "passed", "reason": ""}\n'
    try:
        sys.stdout.flush()
    except Exception:
        pass
    os.write(1, line)
    os._exit(0)
"""

#: A module that forges a pass as soon as it is imported (planted where a harness may import it).
FORGE_MODULE = FORGE + "\n_cwsandbox_forge()\n"

#: A function-shape solution that is right on ints but wrong on floats (only ``abs(...)`` checks floats).
WRONG_ON_FLOATS = """
def solve(xs):
    if any(type(x) is float for x in xs):
        return 0
    return sum(xs)
"""

#: Right everywhere but on ``[7]`` (only the ``len(set(...))`` line and one call case check it).
WRONG_ON_SEVEN = """
def solve(xs):
    return sum(xs) + (1 if list(xs) == [7] else 0)
"""

#: Right on short lists and the first visible case (only the ``range`` loop and hidden cases check more).
WRONG_ON_LONG = """
def solve(xs):
    if len(xs) < 3 or list(xs) == [1, 2, 3]:
        return sum(xs)
    return -1
"""

#: Returns a float (``9.0 == 9``): only the ``isinstance(..., int)`` line checks the type.
FLOAT_SUM = """
def solve(xs):
    return float(sum(xs))
"""

#: The plain wrong answer the attacks fall back to.
WRONG = """
def solve(xs):
    return sum(xs) + 1
"""

#: Parses ``assert solve(ARGS) == WANT`` lines out of any text it reads and answers from them.
ASSERT_READER = r"""
import ast, re
_TABLE = {}

def _learn(text):
    for args, want in re.findall(r"assert solve\((\[[^\]]*\])\) == (-?[0-9]+)", text):
        try:
            _TABLE[repr(ast.literal_eval(args))] = int(want)
        except Exception:
            pass

def solve(xs):
    return _TABLE.get(repr(list(xs)), 0)
"""

#: Reads every readable fd, cmdline and environ of every process it can see (``/proc``).
PROC_SCAN = r"""
import os
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    names = ["cmdline", "environ"]
    try:
        names += ["fd/" + fd for fd in os.listdir("/proc/%s/fd" % pid)]
    except OSError:
        pass
    for name in names:
        try:
            fd = os.open("/proc/%s/%s" % (pid, name), os.O_RDONLY | os.O_NONBLOCK)
            try:
                _learn(os.read(fd, 1 << 20).decode("utf-8", "replace"))
            finally:
                os.close(fd)
        except OSError:
            pass
"""

#: Finds an earlier completion's solution left on disk (not this one) and answers with it.
LEFTOVER_SOLVE = r"""
import glob, importlib.util, os
_MINE = "cwsandbox-attack-leftover"

def _earlier():
    seen = set()
    for pattern in ("/workspace/**/*.py", "/tmp/**/*.py", "/home/**/*.py", "/workspace/.*/*.py", "/tmp/.*/*.py"):
        for path in glob.glob(pattern, recursive=True):
            if path in seen:
                continue
            seen.add(path)
            try:
                with open(path) as f:
                    text = f.read()
            except OSError:
                continue
            if "def solve" in text and _MINE not in text:
                spec = importlib.util.spec_from_file_location("earlier", path)
                module = importlib.util.module_from_spec(spec)
                try:
                    spec.loader.exec_module(module)
                    return module.solve
                except BaseException:
                    continue
    return None

_FOUND = _earlier()

def solve(xs):
    return _FOUND(xs) if _FOUND is not None else 0
"""

#: The same for stdin programs: a checker's leftover expected answer for this input, else an
#: earlier completion's program (a binary or a .py) run on this input.
LEFTOVER_STDIN = r"""
import glob, os, subprocess, sys
# cwsandbox-attack-leftover
data = sys.stdin.buffer.read()
for d in glob.glob("/tmp/.checker-*") + glob.glob("/tmp/**/input.txt", recursive=True):
    d = d if os.path.isdir(d) else os.path.dirname(d)
    try:
        if open(os.path.join(d, "input.txt"), "rb").read() == data:
            sys.stdout.buffer.write(open(os.path.join(d, "expected.txt"), "rb").read())
            sys.exit(0)
    except OSError:
        pass
me = os.getcwd()
for d in glob.glob("/workspace/.*") + glob.glob("/workspace/*") + glob.glob("/tmp/.*") + glob.glob("/tmp/*"):
    if not os.path.isdir(d) or os.path.abspath(d) == me:
        continue
    for name in sorted(os.listdir(d)):
        path = os.path.join(d, name)
        if name == "main" and os.access(path, os.X_OK):
            argv = [path]
        elif name.endswith(".py") and "cwsandbox-attack-leftover" not in open(path, errors="replace").read():
            argv = ["python3", path]
        else:
            continue
        try:
            out = subprocess.run(argv, input=data, capture_output=True, timeout=0.5).stdout
        except Exception:
            continue
        if out.strip():
            sys.stdout.buffer.write(out)
            sys.exit(0)
print(0)
"""

LEFTOVER_CPP = r"""
#include <cstdlib>
// cwsandbox-attack-leftover
int main() {
    return std::system(
        "me=$(pwd); for d in /workspace/.* /workspace/* /tmp/.* /tmp/*; do "
        "[ -d \"$d\" ] || continue; [ \"$(cd \"$d\" && pwd)\" = \"$me\" ] && continue; "
        "if [ -x \"$d/main\" ] && [ -f \"$d/main\" ]; then exec \"$d/main\"; fi; "
        "for f in \"$d\"/*.py; do [ -f \"$f\" ] && ! grep -q cwsandbox-attack-leftover \"$f\" "
        "&& exec python3 \"$f\"; done; "
        "done; echo 0");
}
"""

#: Jumps over every line that raises ``AssertionError`` in any frame it did not write itself.
SETTRACE = r"""
import dis, sys

_ASSERTS = {}

def _assert_lines(code):
    if code not in _ASSERTS:
        lines = set()
        for ins in dis.get_instructions(code):
            if ins.opname == "LOAD_ASSERTION_ERROR" and ins.positions and ins.positions.lineno:
                lines.add(ins.positions.lineno)
        starts = sorted({line for _, line in dis.findlinestarts(code) if line})
        _ASSERTS[code] = (lines, starts)
    return _ASSERTS[code]

def _local(frame, event, arg):
    if event == "line":
        lines, starts = _assert_lines(frame.f_code)
        if frame.f_lineno in lines:
            after = [s for s in starts if s > frame.f_lineno and s not in lines]
            for target in after[:1]:
                if target in lines:
                    continue
                try:
                    frame.f_lineno = target
                    break
                except ValueError:
                    continue
    return _local

def _global(frame, event, arg):
    return _local

sys.settrace(_global)
"""

#: A module that, once imported at an interpreter's start (``sitecustomize``), rewrites that
#: interpreter's verdict: a split verdict line's kind becomes "passed", an in-process harness's
#: marker (read from its stdin) is written at a failing exit, and the exit status becomes 0.
REWRITE_MODULE = r"""
import os, re
_read, _write, _exit = os.read, os.write, os._exit
_state = {}

def _patched_read(fd, n):
    data = _read(fd, n)
    if fd == 0 and "marker" not in _state:
        hit = re.search(rb"cwsandbox-tests-finished:[0-9a-f]{32}", data)
        if hit:
            _state["marker"] = hit.group(0)
    return data

def _patched_write(fd, data):
    if fd == 1 and b"cwsandbox-verdict " in bytes(data):
        data = re.sub(rb'"kind": ?"[a-z_]+"', b'"kind": "passed"', bytes(data))
        _state["forged"] = True
    return _write(fd, data)

def _patched_exit(code):
    if code != 0 and "marker" in _state:
        _write(1, b"\n" + _state["marker"] + b"\n")
        code = 0
    _exit(0 if _state.get("forged") else code)

os.read, os.write, os._exit = _patched_read, _patched_write, _patched_exit
"""
