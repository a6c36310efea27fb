"""What runs in a command's own process, between the worker's fork and the program (stdlib only).

A *clean* worker never reads a request: for ``run_python`` it forks, and the
child reads its own request -- cwd, environment, source -- from the memfd the
agent wrote it to (``protocol.pack_meta`` format: JSON, then the source), so the
only request that ever exists in this interpreter's memory is its own. The
worker's interpreter is itself a fork of the agent's template, which was forked
before the agent read its first request. Nothing of earlier requests, files or
outputs is therefore in memory a program can read (``/proc/self/mem``).

The child then runs the source as ``python3 -c`` would: ``sys.argv == ["-c"]``,
``""`` first on ``sys.path``, a fresh ``__main__``, exit code 0, the
``SystemExit`` code, or 1 after an uncaught exception (its traceback printed
without this module's frame), non-daemon threads joined and ``atexit``
handlers run. A failure before the program starts (a working directory that
does not exist) is reported on its stderr, exit code 126.
"""

from __future__ import annotations

import os
import signal
import sys

from . import protocol, sysapi

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn

#: Signals a command starts with at their default action (the agent's processes change some).
DEFAULT_SIGNALS = (
    signal.SIGPIPE,
    signal.SIGXFSZ,
    signal.SIGINT,
    signal.SIGQUIT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGALRM,
    signal.SIGCHLD,
)


def read_request(fd: int) -> tuple[dict[str, Any], bytes]:
    """The request in a memfd: its metadata and raw part (``ValueError`` if malformed)."""
    chunks = []
    while True:
        data = os.read(fd, 1 << 20)
        if not data:
            break
        chunks.append(data)
    return protocol.unpack_meta(b"".join(chunks))


def exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        sys.stderr.write(f"{code}\n")
    except BaseException:  # a broken stderr at exit: the exit code stands
        pass
    return 1


def run_source(source: str, env: dict[str, str]) -> int:
    """Run Python source as ``python3 -c`` would (module docstring); the exit code."""
    import builtins
    import types

    for sig in DEFAULT_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.clear()
    os.environ.update(env)
    sys.argv[:] = ["-c"]
    sys.path.insert(0, "")
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    rc = 0
    try:
        exec(compile(source, "<string>", "exec"), main.__dict__)
    except SystemExit as exc:
        rc = exit_code(exc.code)
    except BaseException:
        etype, value, tb = sys.exc_info()
        if etype is not None and value is not None:
            below = tb.tb_next if tb is not None else None  # hide this function's own frame
            sys.excepthook(etype, value.with_traceback(below), below)
        rc = 1
    try:
        threading = sys.modules.get("threading")
        if threading is not None:
            threading._shutdown()  # wait for non-daemon threads, as Python does
    except BaseException:  # a thread's failure does not change the exit code
        pass
    try:
        import atexit

        atexit._run_exitfuncs()
    except BaseException:  # exit handlers of user code may fail; the exit code stands
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # a closed or broken pipe at exit is not our error
            pass
    return rc


def python_child(fds: list[int], close: list[int]) -> NoReturn:
    """In the forked child: become the command (``fds`` = request, stdin, stdout, stderr) and run it."""
    code = 1
    try:
        os.setpgid(0, 0)
        sysapi.prctl(sysapi.PR_SET_DUMPABLE, 1)  # user code: an ordinary process (the worker is not dumpable)
        meta, source = read_request(fds[0])
        for i, fd in enumerate(fds[1:4]):
            os.dup2(fd, i)
        for fd in (*fds, *close):
            if fd > 2:
                os.close(fd)
        try:
            os.chdir(str(meta["c"]))
        except OSError as exc:
            os.write(2, f"cwsandbox: cannot change directory to {meta['c']!r}: {exc.strerror}\n".encode())
            code = protocol.SPAWN_FAILED
        else:
            code = run_source(source.decode("utf-8", "surrogateescape"), dict(meta["e"]))
    finally:
        os._exit(code)
