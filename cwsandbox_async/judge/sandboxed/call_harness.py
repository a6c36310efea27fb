"""Call-based cases (APPS/TACO ``fn_name``, LiveCodeBench functional, asserts): call the candidate, write the result.

Runs inside the sandbox as ``python3 call_harness.py <solution.py> <fn_name>``, one fresh process
per case, under the judge's runner. stdin holds the arguments as a list in the same token format
as the result (written by the driver, read here without recursion: any int size, any depth). The candidate
is imported as the module ``solution``; its own prints go to stderr (fd 1 is taken away before it
runs), and the result is written as one line of tokens (``_callvalue`` in the driver reads it:
ints in hexadecimal, strs in base64, containers as a tag with their size followed by their
members) on the original stdout, after which the process ends at once (``os._exit``): no
``atexit`` hook or thread of the candidate runs after it. The line is written by an explicit
stack, not recursion, so no depth of the value and no size of an int is lost; a value that
contains itself writes until the output limit stops it. The driver compares the value with the
expected one, outside this process: the candidate cannot change the verdict except by returning
(or printing) the right value.

If the module has a class ``Solution`` with a method ``fn_name`` (LeetCode style), that method of a
fresh instance is called; else the module-level function. A value of another type is written as
its ``repr`` (compared as a string). Exit 0 after writing the result; 1 when the call raised
(traceback on stderr).
"""

import base64
import os
import sys

CHUNK = 1 << 16


def b64(text):
    return base64.b64encode(text.encode("utf-8", "surrogatepass")).decode("ascii")


def token(value, todo):
    """``value``'s token; a container's members are pushed on ``todo`` (first member last)."""
    if value is None:
        return "n"
    if value is True or value is False:
        return "t" if value else "f"
    if isinstance(value, int):
        return "i%x" % int(value)
    if isinstance(value, float):
        return "d" + repr(float(value))
    if isinstance(value, str):
        return "s" + b64(str(value))
    if isinstance(value, (list, tuple)):
        todo.extend(reversed(list(value)))
        return ("L" if isinstance(value, list) else "U") + str(len(value))
    if isinstance(value, (set, frozenset)):
        todo.extend(list(value))
        return ("S" if isinstance(value, set) else "F") + str(len(value))
    if isinstance(value, dict):
        pairs = list(value.items())
        for k, v in reversed(pairs):
            todo.append(v)
            todo.append(k)
        return "D" + str(len(pairs))
    try:
        text = repr(value)
    except Exception:
        text = "<unrepresentable %s>" % type(value).__name__
    return "r" + b64(text)


def write_all(fd, data):
    while data:
        data = data[os.write(fd, data) :]


def emit(value, fd):
    """Write ``value`` as one token line on ``fd``, in chunks (a huge value never sits in memory twice)."""
    todo, out, size = [value], [], 0
    while todo:
        tok = token(todo.pop(), todo)
        out.append(tok)
        size += len(tok) + 1
        if size >= CHUNK:
            write_all(fd, (" ".join(out) + " ").encode("ascii"))
            out, size = [], 0
    write_all(fd, (" ".join(out) + "\n").encode("ascii"))


def scalar(kind, body):
    if kind == "n":
        return None
    if kind in "tf":
        return kind == "t"
    if kind == "i":
        return int(body, 16)
    if kind == "d":
        return float(body)
    return base64.b64decode(body).decode("utf-8", "surrogatepass")


def build(kind, members):
    if kind == "L":
        return members
    if kind == "U":
        return tuple(members)
    if kind == "S":
        return set(members)
    if kind == "F":
        return frozenset(members)
    return dict(zip(members[0::2], members[1::2]))


def decode(text):
    """The value of a token line (the driver's own: trusted, but as deep or big as a dataset makes it)."""
    frames = [["L", [], 1]]
    for tok in text.split():
        kind, body = tok[0], tok[1:]
        if kind in "LUSFD":
            frames.append([kind, [], int(body) * (2 if kind == "D" else 1)])
        else:
            frames[-1][1].append(scalar(kind, body))
            frames[-1][2] -= 1
        while frames[-1][2] == 0:
            kind, members, _ = frames.pop()
            if not frames:
                return members[0]
            frames[-1][1].append(build(kind, members))
            frames[-1][2] -= 1
    raise ValueError("the arguments' line ended inside a value")


def main():
    path, name = sys.argv[1], sys.argv[2]
    args = decode(sys.stdin.read() or "L0")
    result_fd = os.dup(1)
    os.dup2(2, 1)  # the candidate's prints go to stderr
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 100000))
    import importlib.util

    spec = importlib.util.spec_from_file_location("solution", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["solution"] = module
    spec.loader.exec_module(module)
    cls = getattr(module, "Solution", None)
    fn = getattr(cls(), name) if cls is not None and hasattr(cls, name) else getattr(module, name)
    value = fn(*args)
    sys.stdout.flush()
    emit(value, result_fd)
    os._exit(0)


main()
