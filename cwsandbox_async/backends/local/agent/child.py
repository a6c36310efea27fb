"""What runs in a fork of PID 1: it becomes one command, one Python program, or one file operation.

Commands skip this fork when the sandbox has the native spawner (``spawn.c``, see ``execs.Execs.spawn``):
it takes the same steps, in the same order, with the same exit codes and messages, without a copy of
PID 1. Python programs and file operations always come here.

PID 1 never reads a request; it forks, and the child (``start``) reads its own from the memfd the
driver wrote it to, so the only request that ever exists in a child's memory is its own, and PID 1's
memory -- which every fork starts from -- holds none (``run_python`` programs scan it in
``tests/local/test_clean_memory.py``). The child, first thing, before it reads anything:

1. joins the commands' cgroup(s) (``joins``: the memory limit is there, PID 1 stays outside it);
2. puts the exec's stdin, stdout and stderr on 0, 1 and 2 and closes every other descriptor (PID 1's
   socket, its other execs' fds);
3. starts a session of its own and becomes a *child subreaper*: every process the command leaves
   behind (double-forked, ``setsid`` daemons) stays below it while it runs, so its tree is its exec's
   whole tree (seccomp keeps it so: ``CLONE_PARENT`` and clearing the subreaper flag are denied);
4. applies the sandbox's rlimits (its OOM score, 1000, is PID 1's: see ``init``).

Then a command is ``execve``'d (a failure: ``cwsandbox: ...`` on stderr, exit 126, or 127 when not
found); Python source runs in this process as ``python3 -c`` would: ``sys.argv == ["-c"]``, ``""``
first on ``sys.path`` unless ``PYTHONSAFEPATH`` is set in its environment (the driver sets it by
default), a fresh ``__main__``, exit code 0, the ``SystemExit`` code, or 1 after an
uncaught exception (its traceback printed without this module's frame), non-daemon threads joined
and ``atexit`` handlers run. A file operation (``files``) stays non-dumpable, in PID 1's cgroups,
and writes the file's bytes, or its error message with exit code 1, into the result memfd.
"""

from __future__ import annotations

import errno
import os
import resource
import signal
import sys

from . import files, protocol, sysapi

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn

#: Signals a command starts with at their default action (PID 1 and Python change some).
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


def apply_limits(limits: dict[str, int]) -> None:
    """The sandbox's rlimits (``cpu``, ``fsize``, ``nproc``, ``as``) on this process and its children."""
    table = (
        ("cpu", resource.RLIMIT_CPU, 1),
        ("fsize", resource.RLIMIT_FSIZE, 0),
        ("nproc", resource.RLIMIT_NPROC, 0),
        ("as", resource.RLIMIT_AS, 0),
    )
    for name, key, extra in table:
        value = limits.get(name)
        if value:
            try:
                resource.setrlimit(key, (value, value + extra))
            except (OSError, ValueError):
                pass


def read_all(fd: int) -> bytes:
    """Everything in the memfd ``fd``, from its start (``pread``: its offset does not matter)."""
    size = os.fstat(fd).st_size
    data = os.pread(fd, size, 0)
    while len(data) < size:  # a short read (a very large request)
        more = os.pread(fd, size - len(data), len(data))
        if not more:
            break
        data += more
    return data


def which(cmd: bytes, env: dict[bytes, bytes]) -> bytes | None:
    if b"/" in cmd:
        return cmd
    for d in env.get(b"PATH", b"/usr/local/bin:/usr/bin:/bin").split(b":"):
        path = os.path.join(d or b".", cmd)
        if os.access(path, os.X_OK) and not os.path.isdir(path):
            return path
    return None


def start(mode: int, fds: list[int], joins: list[int], config: dict[str, Any]) -> NoReturn:
    """In the fork: become what ``mode`` says (module docstring). Never returns."""
    code = protocol.SPAWN_FAILED
    try:
        if mode != protocol.M_EXEC:  # execve resets every handled signal; PID 1 ignores none
            signal.set_wakeup_fd(-1)
            for sig in DEFAULT_SIGNALS:
                signal.signal(sig, signal.SIG_DFL)
        if mode in (protocol.M_READ, protocol.M_WRITE):
            code = _file_op(mode, fds, config)
        else:
            code = _command(mode, fds, joins, config)
    except BaseException as exc:  # before the program ran: a bug of ours, said so on its stderr
        _fail(protocol.SPAWN_FAILED, f"internal error before the command started: {exc!r}")
    finally:
        os._exit(code)


def _isolate(keep: int) -> None:
    """Close every descriptor above 2 except ``keep`` (listed, not guessed: PID 1's limit is high)."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd != keep:
            try:
                os.close(fd)
            except OSError:  # the listing's own descriptor, closed already
                pass


def _command(mode: int, fds: list[int], joins: list[int], config: dict[str, Any]) -> int:
    request, out, err = fds[0], fds[1], fds[2]
    stdin = fds[3] if len(fds) > 3 else os.open(os.devnull, os.O_RDONLY)
    os.dup2(stdin, 0)
    os.dup2(out, 1)
    os.dup2(err, 2)
    try:
        for fd in joins:
            os.write(fd, b"0")  # "0" is this process: the memory limit binds it and all it starts
    except OSError as exc:  # never run outside the limit
        return _fail(protocol.SPAWN_FAILED, f"cannot join the commands' cgroup: {exc.strerror}")
    if mode != protocol.M_EXEC:
        _isolate(request)  # a command's execve closes them: every descriptor of PID 1 is close-on-exec
    os.setsid()
    sysapi.prctl(sysapi.PR_SET_CHILD_SUBREAPER, 1)
    if config.get("die_with_parent"):
        sysapi.prctl(sysapi.PR_SET_PDEATHSIG, signal.SIGKILL)
    limits = config.get("limits")
    if limits:
        apply_limits(limits)
    cwd, argv, env, raw = protocol.unpack_request(read_all(request))
    os.close(request)
    try:
        os.chdir(cwd)
    except OSError as exc:
        return _fail(protocol.SPAWN_FAILED, f"cannot change directory to {_text(cwd)!r}: {exc.strerror}")
    if mode == protocol.M_PYTHON:
        sysapi.prctl(sysapi.PR_SET_DUMPABLE, 1)  # user code: an ordinary process (PID 1 is not dumpable)
        return run_source(_text(raw), {_text(k): _text(v) for k, v in env.items()})
    path = which(argv[0], env)
    if path is None:
        return _fail(protocol.NOT_FOUND, f"{_text(argv[0])}: command not found")
    try:
        os.execve(path, argv, env)  # dumpable again; every descriptor above 2 closes (close-on-exec)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return _fail(protocol.NOT_FOUND, f"{_text(argv[0])}: command not found")
        if exc.errno in (errno.EACCES, errno.EPERM):
            return _fail(protocol.SPAWN_FAILED, f"{_text(argv[0])}: permission denied")
        return _fail(protocol.SPAWN_FAILED, f"cannot start the command: {exc.strerror}")


def _text(b: bytes) -> str:
    return b.decode("utf-8", "surrogateescape")


def _fail(code: int, message: str) -> int:
    try:
        os.write(2, f"cwsandbox: {message}\n".encode())
    except OSError:  # the caller went away: the exit code stands
        pass
    return code


def _file_op(mode: int, fds: list[int], config: dict[str, Any]) -> int:
    request, result = fds[0], fds[1]
    os.dup2(result, 1)
    _isolate(request)
    limit, path_b, shown_b, start = protocol.read_file_request(request)  # a write's data: copied by the kernel
    path, shown = os.fsdecode(path_b), shown_b.decode("utf-8", "surrogateescape")
    own = {files.identity(fd) for fd in (0, 1, 2, request)}
    try:
        if mode == protocol.M_READ:
            files.read_file(path, shown, limit, 1, own)
        else:
            files.write_file(path, shown, request, start, config.get("file_limit"), own)
    except files.FileOpError as exc:
        os.ftruncate(1, 0)  # no partial data: only the message
        os.pwrite(1, str(exc).encode("utf-8", "replace")[:4096], 0)
        return 1
    return 0


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

    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.clear()
    os.environ.update(env)
    sys.argv[:] = ["-c"]
    if not env.get("PYTHONSAFEPATH"):  # as python3 -c: the working directory is importable
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
