"""The native spawner of template-born sandboxes (``agent/spawn.c``): built on first use, or not used.

Every exec of a command in a sandbox needs a process that joins the commands' cgroup, becomes a child
subreaper, takes the sandbox's rlimits and then ``execve``s the command. Without the spawner that is
a fork of PID 1 (a full CPython: its page tables, then copy-on-write faults on both sides until the
``execve``); with it, PID 1 ``posix_spawn``s (a ``vfork``: nothing is copied) a small static program
that does those steps and ``execve``s (``agent/execs.py``); file operations run in it too
(``cwspawn --file``). ``run_python`` still forks PID 1: it runs Python.

``spawner()`` returns the host path of the binary, compiling it once per source version with the
host's C compiler (``cc``; a static program without the C library) into the user's cache
(``$XDG_CACHE_HOME`` or ``~/.cache``, ``cwsandbox_async/``), named after a hash of the source and the
machine, written atomically and checked by running it. It is bound read-only into every sandbox at
``INSIDE``, execute-only (mode 0111: the sandbox cannot read it, so the kernel makes it non-dumpable
from its ``execve`` until the command's). Where it cannot be built (no compiler, no writable cache,
an unsupported machine), or ``CWSANDBOX_LOCAL_SPAWNER=python`` asks for the pure-Python path, the
result is ``None`` and each exec forks PID 1 as before; a build failure is said once at WARNING,
the variable's choice once at INFO (``asked_once``: what the caller asked for is no warning, but a
variable left set in an environment should still show up in a log that keeps INFO).
Nothing here raises.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from ..._log import log

__all__ = ["ENV", "INSIDE", "SOURCE", "asked_once", "spawner", "wanted", "warn_once"]

SOURCE = Path(__file__).resolve().parent / "agent" / "spawn.c"
#: Where every template-born sandbox sees the binary.
INSIDE = "/run/cwsandbox/cwspawn"
#: ``python``: never build nor use the spawner (every exec forks PID 1); anything else: use it.
ENV = "CWSANDBOX_LOCAL_SPAWNER"
_MACHINES = ("x86_64", "aarch64")
#: No C library, no startup code (see ``agent/spawn.c``): its exec costs ~0.1 ms of CPU, a static
#: glibc program's ~1 ms.
CFLAGS = (
    "-O2",
    "-s",
    "-static",
    "-nostdlib",
    "-ffreestanding",
    "-fno-builtin",
    "-fno-stack-protector",
    "-fno-pie",
    "-no-pie",
    "-fno-asynchronous-unwind-tables",
)

#: Bounds on the one-time build and its self-check (a hang guard: a build takes ~0.5 s, the check ms).
#: Past them the build is given up and every exec forks PID 1, said once at WARNING.
BUILD_TIMEOUT_SECONDS = 120.0
CHECK_TIMEOUT_SECONDS = 30.0

_lock = threading.Lock()
_built: dict[str, str | None] = {}
_warned = False
_asked = False


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cwsandbox_async"


def warn_once(reason: str) -> None:
    """Say once per process, at WARNING, that execs fork PID 1 because the spawner is missing."""
    global _warned
    if not _warned:
        _warned = True
        log.warning(
            "the native spawner is not available: every exec forks the sandbox's PID 1 (slower)",
            reason=reason,
            hint=f"install a C compiler (cc), or set {ENV}=python to silence this",
        )


def asked_once() -> None:
    """Say once per process, at INFO, that ``CWSANDBOX_LOCAL_SPAWNER=python`` chose the fork of PID 1."""
    global _asked
    if not _asked:
        _asked = True
        log.info(f"{ENV}=python: every exec forks the sandbox's PID 1 (the native spawner is not used)")


def wanted() -> bool:
    """False when ``CWSANDBOX_LOCAL_SPAWNER=python`` asks for the pure-Python path."""
    return os.environ.get(ENV, "").strip().lower() != "python"


def spawner() -> str | None:
    """The host path of a working spawner, built if needed; ``None`` for the Python path (module docstring).

    Blocking (a first build runs the compiler, ~0.1-1 s): call it from a worker thread."""
    if not wanted():
        asked_once()
        return None
    with _lock:
        try:
            source = SOURCE.read_bytes()
        except OSError as exc:
            warn_once(f"cannot read {SOURCE}: {exc.strerror}")
            return None
        machine = platform.machine()
        key = hashlib.sha256(b"\0".join([source, machine.encode(), *(f.encode() for f in CFLAGS)])).hexdigest()[:16]
        if key in _built:
            return _built[key]
        path: str | None = None
        try:
            path = _build(source, machine, key)
        except (OSError, subprocess.SubprocessError) as exc:
            warn_once(str(exc))
        _built[key] = path
        return path


def _build(source: bytes, machine: str, key: str) -> str | None:
    if machine not in _MACHINES:
        warn_once(f"no spawner for machine {machine}")
        return None
    target = _cache_dir() / f"cwspawn-{machine}-{key}"
    if target.exists() and _works(str(target)):
        return str(target)
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        warn_once("no C compiler (cc, gcc or clang) on PATH")
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as tmp:
        src = os.path.join(tmp, "spawn.c")
        with open(src, "wb") as f:
            f.write(source)
        out = os.path.join(tmp, "cwspawn")
        proc = subprocess.run(
            [cc, *CFLAGS, "-o", out, src],
            capture_output=True,
            timeout=BUILD_TIMEOUT_SECONDS,
            check=False,
            stdin=subprocess.DEVNULL,
        )
        if proc.returncode != 0:
            warn_once(f"the C compiler failed: {proc.stderr.decode('utf-8', 'replace').strip()[-500:]}")
            return None
        os.chmod(out, 0o111)  # execute-only: see the module docstring
        if not _works(out):
            warn_once("the built spawner does not run")
            return None
        os.replace(out, target)
    with contextlib.suppress(OSError):
        target.parent.chmod(0o755)
    return str(target)


def _works(path: str) -> bool:
    try:
        proc = subprocess.run(
            [path, "--check"], capture_output=True, timeout=CHECK_TIMEOUT_SECONDS, check=False, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0 and proc.stdout == b"ok\n"
