"""Call-based cases (APPS/TACO ``fn_name``, LiveCodeBench functional, asserts): call the candidate, print the result.

Runs inside the sandbox as ``python3 call_harness.py <solution.py> <fn_name>``, one fresh process
per case, under the judge's runner. stdin holds the arguments as a JSON list. The candidate is
imported as ``__main__``-less module ``solution``; its own prints go to stderr (fd 1 is taken away
before it runs), and the result is written as one JSON line on the original stdout, after which the
process ends at once (``os._exit``): no ``atexit`` hook or thread of the candidate runs after it.
The driver compares that line with the expected value, outside this process: the candidate cannot
change the verdict except by returning (or printing) the right value.

If the module has a class ``Solution`` with a method ``fn_name`` (LeetCode style), that method of a
fresh instance is called; else the module-level function. Tuples become lists and sets sorted lists
(as JSON would compare them); a value JSON cannot hold is written as its ``repr`` (compared as a
string). Exit 0 after writing the result; 1 when the call raised (traceback on stderr).
"""

import json
import os
import sys


def plain(value):
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, (set, frozenset)):
        items = [plain(v) for v in value]
        try:
            return sorted(items)
        except TypeError:
            return items
    if isinstance(value, dict):
        return {str(k) if not isinstance(k, str) else k: plain(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def main():
    path, name = sys.argv[1], sys.argv[2]
    args = json.loads(sys.stdin.read() or "[]")
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
    line = json.dumps(plain(value)).encode("utf-8") + b"\n"
    sys.stdout.flush()
    while line:
        line = line[os.write(result_fd, line) :]
    os._exit(0)


main()
