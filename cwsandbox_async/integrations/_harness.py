"""The test harness of the bundled rewards: a pass needs the tests to have run to the end.

A verdict of "passed" used to be "the process exited 0", which a program gets by
ending the process before its tests run: ``os._exit(0)``, ``sys.exit(0)``,
``raise SystemExit(0)``, an ``atexit`` hook that exits 0, a thread that calls
``os._exit(0)`` while the tests run. Here a pass needs three things the driver
checks itself, outside the sandbox, after the command ended:

1. the process exited 0, without a timeout, an OOM kill, a CPU-budget kill or
   truncated output;
2. the last bytes of its stdout are a **marker**: a fresh random token per run
   (``secrets.token_hex(16)``) that the harness writes only after the program and
   its tests returned normally;
3. the harness then ends the process at once (``os._exit``), so no ``atexit`` hook,
   thread or finaliser of the program runs after the verdict was written.

**How the marker stays unknown to the program.** The harness source is a constant
(:data:`HARNESS_SOURCE`: it holds no marker, so ``argv``, ``/proc/self/cmdline`` and
any file it is written to hold none). The marker, the program and the tests reach
the harness on **stdin**, which the harness reads completely and replaces with
``/dev/null`` before the first line of the program runs: ``input()``,
``sys.stdin.read()``, ``os.pread(0, ...)`` and ``/proc/self/fd/0`` find nothing.
The marker is never in the environment, in a file or in another process. Both
programs are compiled before the program runs, so replacing ``compile``/``exec``
in ``builtins`` does not skip the tests, any ``SystemExit`` (even with code 0)
counts as "did not finish"; what the harness calls after the program started
was bound before it. Output the program prints can never end with the
marker unless it knows the marker. The bundled rewards run this exec with
``exclusive=True``, so no process left from earlier in the episode can write into
its output.

**What it does not stop** (see SECURITY.md): a program that deliberately inspects
the harness inside its own interpreter (walks the stack frames with
``sys._getframe``, the garbage collector, or ``/proc/self/mem``) can find the marker
and forge a pass; so can one that subverts the tests themselves instead of exiting
(objects whose ``__eq__`` is always true, patched modules or builtins the tests
use, trace functions that jump over ``assert`` lines). The harness makes the cheap,
well-known hack (exit early) fail; it is not a sandbox between the program and
its tests, which share one interpreter by design.

**A unit that does not compile.** Both units are compiled before any of the program
runs, the tests first. A failure is reported on stdout as ``<marker> compile_error
<reason>`` (the program's: ``SyntaxError at solution.py line 3: expected ':': def f(x)``)
or ``<marker> tests_error <reason>`` (the caller's tests: ``_item.judge`` raises it as a
caller mistake once the driver's own ``compile`` of the tests agrees; a report the driver
does not confirm can only have been forged by a program that read the marker, and is an
``error_exit``).

Differences from running ``code + "\\n" + tests`` with ``python3 -c``: the program
and its tests are two compilation units (``solution.py`` and ``tests.py`` in
tracebacks, with their source lines), ``SystemExit`` is a failure, stdin is empty,
and ``atexit`` hooks and non-daemon threads never run after the tests.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._split import HarnessVerdict

if TYPE_CHECKING:
    from .._types import ExecResult

__all__ = ["HARNESS_SOURCE", "MARKER_PREFIX", "HarnessRun", "harness_run"]

#: Every marker starts with this; 32 random hex digits follow.
MARKER_PREFIX = b"cwsandbox-tests-finished:"
_MARKER_LEN = len(MARKER_PREFIX) + 32
#: stdin starts with ``<marker> <program bytes, 10 digits> <tests bytes, 10 digits> <explain: 0/1>\n``.
_HEADER_LEN = _MARKER_LEN + 1 + 10 + 1 + 10 + 1 + 1 + 1

#: The program the sandbox runs (``python3 -c``-compatible, Python 3.8+). Constant: it holds no secret.
HARNESS_SOURCE = f"""\
def _cwsandbox_harness():
    import builtins, os, sys
    read, write, exit_, err, execute, hook = os.read, os.write, os._exit, sys.stderr, exec, sys.__excepthook__
    streams = (sys.stdout, sys.stderr)
    def take(n):
        data = b""
        while len(data) < n:
            chunk = read(0, n - len(data))
            if not chunk:
                break
            data += chunk
        return data
    head = take({_HEADER_LEN})
    parts = head[:-1].split(b" ")
    ok = len(head) == {_HEADER_LEN} and len(parts) == 4 and parts[1].isdigit() and parts[2].isdigit()
    size = int(parts[1]) + int(parts[2]) if ok else 0
    body = take(size)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    if not ok or len(body) != size:
        err.write("cwsandbox: the harness got incomplete input\\n")
        err.flush()
        exit_(2)
    marker, split, explain = parts[0], int(parts[1]), parts[3] == b"1"
    del head, parts
    passed, unparsed = False, None
    sources, units = {{}}, []
    try:
        sources["solution.py"], sources["tests.py"] = body[:split].decode("utf-8"), body[split:].decode("utf-8")
        del body
        for name in ("tests.py", "solution.py"):  # the tests first: their failure is the caller's
            try:
                units.insert(0, compile(sources[name], name, "exec"))
            except BaseException as exc:
                unparsed = (b"tests_error " if name == "tests.py" else b"compile_error ", name, exc)
                raise
        main = type(sys)("__main__")
        main.__dict__["__builtins__"] = builtins
        sys.modules["__main__"] = main
        for unit in units:
            execute(unit, main.__dict__)
        passed = True
    except SystemExit as exc:
        try:
            err.write("cwsandbox: the program ended the process (SystemExit(%r)) before its tests finished\\n"
                      % (exc.code,))
        except BaseException:
            pass
    except BaseException as exc:
        try:
            if explain:  # source lines in the traceback, for a reader (costs ~10 ms of imports)
                import linecache, traceback
                for name, source in sources.items():
                    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
                traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next, file=err)
            else:  # the interpreter's own display: no imports
                below = exc.__traceback__.tb_next
                hook(type(exc), exc.with_traceback(below), below)
        except BaseException:
            pass
    for stream in (sys.stdout, sys.stderr) + streams:
        try:
            stream.flush()
        except BaseException:
            pass
    if unparsed is not None:  # nothing of the program ran: a report only the harness can make
        try:
            kind, name, exc = unparsed
            if isinstance(exc, SyntaxError):
                where = " at %s line %s" % (exc.filename or name, exc.lineno) if exc.lineno else " in " + name
                text = " ".join((exc.text or "").split())
                why = "%s%s: %s" % (type(exc).__name__, where, exc.msg) + (": " + text if text else "")
            else:
                why = "%s in %s: %s" % (type(exc).__name__, name, exc)
            data = b"\\n" + marker + b" " + kind + " ".join(why.split()).encode("utf-8", "replace") + b"\\n"
            while data:
                data = data[write(1, data):]
        except BaseException:
            pass
    if passed:
        try:
            data = b"\\n" + marker + b"\\n"
            while data:
                data = data[write(1, data):]
        except BaseException:
            passed = False
    exit_(0 if passed else 1)
_cwsandbox_harness()
"""


@dataclass(frozen=True, slots=True)
class HarnessRun:
    """One run of a program against its tests: what to send, and how to read the result.

    Run ``source`` as Python with ``stdin`` (``run_python(sandbox, run.source,
    stdin=run.stdin, ...)``); then ``passed(result)`` is the verdict and
    ``output(result)`` the program's stdout without the marker.
    """

    source: str
    stdin: bytes
    marker: bytes
    tests: str | None = None

    @property
    def _suffix(self) -> bytes:
        return b"\n" + self.marker + b"\n"

    def passed(self, result: ExecResult) -> bool:
        """True only if the tests ran to their end: exit 0, no kill of any kind, and the marker last on stdout."""
        return (
            result.returncode == 0
            and not result.timed_out
            and not result.truncated
            and not result.oom_killed
            and not result.cpu_exceeded
            and result.stdout_bytes.endswith(self._suffix)
        )

    def verdict(self, result: ExecResult) -> HarnessVerdict | None:
        """The verdict's kind and reason, read from the exit and stderr (this harness writes no verdict line)."""
        if self.passed(result):
            return HarnessVerdict("passed", "")
        line = result.stdout_bytes.rstrip(b"\n").rsplit(b"\n", 1)[-1]
        if line.startswith(self.marker + b" "):  # the harness's report that a unit does not compile
            kind, _, why = line[len(self.marker) + 1 :].decode("utf-8", errors="replace").partition(" ")
            if kind == "compile_error":
                return HarnessVerdict(kind, why)
            if kind == "tests_error" and not _compiles(self.tests or ""):
                return HarnessVerdict(kind, why)
            return HarnessVerdict(
                "error_exit",
                f"the harness reported {kind} ({why}), which the driver does not confirm: a program that read"
                " the marker forged it, or the sandbox's Python cannot compile what the driver's can",
            )
        err = result.stderr_bytes.decode("utf-8", errors="replace").strip()
        last = err.splitlines()[-1] if err else ""
        if result.returncode == 0 or "before its tests finished" in last:
            return HarnessVerdict("early_exit", last or "the program ended its process before its tests finished")
        if last.startswith("AssertionError"):
            return HarnessVerdict("wrong_answer", last)
        how = f"killed by signal {result.signal}" if result.signal else f"exit code {result.returncode}"
        return HarnessVerdict("error_exit", last or f"{how}, with nothing on stderr")

    def output(self, result: ExecResult) -> str:
        """The program's stdout (decoded with replacement), without the marker the harness added."""
        out = result.stdout_bytes
        if out.endswith(self._suffix):
            out = out[: -len(self._suffix)]
        return out.decode("utf-8", errors="replace")


def harness_run(code: str, tests: str | None, *, explain: bool = False) -> HarnessRun:
    """A ``HarnessRun`` of ``code`` followed by ``tests`` (``None``: the program must only run to its end).

    Both must be encodable as UTF-8 (``clean_text`` makes them so). A fresh marker is drawn per call.
    ``explain``: a failure's traceback shows the source lines (for a model reading it; it costs the
    imports of ``traceback``, about 10 ms); otherwise the interpreter's own, cheaper display is used.
    """
    marker = MARKER_PREFIX + secrets.token_hex(16).encode()
    program, checks = code.encode("utf-8"), (tests or "").encode("utf-8")
    header = b"%s %010d %010d %d\n" % (marker, len(program), len(checks), int(explain))
    return HarnessRun(source=HARNESS_SOURCE, stdin=header + program + checks, marker=marker, tests=tests)


def _compiles(tests: str) -> bool:
    """Whether ``tests`` compiles here (the driver's own check of a harness's ``tests_error``)."""
    try:
        compile(tests, "tests.py", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    return True
