"""Languages as data: how to compile and run a source file, and how to ask for the toolchain's version.

Commands are argv templates; the judge fills in ``{src}`` (the source file), ``{exe}`` (the
compiled program), ``{dir}`` (the completion's private build directory, under the sandbox's
working directory), ``{class}`` (Java: the public class), ``{memory_mib}`` (the case's memory
limit) and ``{cache}`` (a per-sandbox cache directory under ``/tmp``, for Go's build cache).
Every path a compiler writes is under ``{dir}``, ``{cache}`` or ``/tmp``: local sandboxes see
the host's root read-only and have a read-only, empty ``HOME``.

Per-language defaults (measured here: 2 cores, cgroup v1):

- **java**: ``javac`` and ``java`` with ``-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xshare:auto``
  (fewer threads, faster start); the heap is capped at the case's memory limit (``-Xmx``) and the
  whole JVM's resident memory may exceed it by ``memory_extra_mib`` (96) before it is a memory
  limit; ``time_extra_seconds`` 1.0 of CPU for its start. It needs ``pids`` of at least 64.
- **go**: ``/usr/local/go/bin`` added to ``PATH`` (the official install), ``GOCACHE={cache}``,
  ``HOME``/``GOPATH`` under ``{dir}``, ``GOTOOLCHAIN=local``,
  ``GOPROXY=off``, ``GOFLAGS=-buildvcs=false``, ``GOTELEMETRY=off``. The first compile in a fresh
  sandbox builds the standard packages it uses into ``{cache}`` (about 17 s of CPU here); later
  compiles in the same sandbox reuse it (about 0.5 s). ``compile_seconds`` 60.
- **rust**: ``rustc`` directly (no cargo, no network), ``-O``, edition 2021.
- **javascript**: ``node`` with ``--max-old-space-size={memory_mib}``; the compile step is
  ``node --check`` (a syntax error is a compile error).
- **python**: the compile step only checks the syntax (``compile()``, nothing written), so a
  syntax error is a compile error, not a runtime error, reported as one line
  (``solution.py:3:9: SyntaxError: invalid syntax``).

``register_language`` adds or replaces an entry (e.g. a ``rustc`` outside ``PATH``:
``register_language(dataclasses.replace(LANGUAGES["rust"], compile=("/opt/rust/bin/rustc", ...)))``).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from .._errors import SandboxValidationError

__all__ = ["LANGUAGES", "Language", "get_language", "register_language"]

_NAME = re.compile(r"^[a-z][a-z0-9_+.-]{0,31}$")
_JAVA_CLASS = re.compile(r"\bpublic\s+(?:final\s+|abstract\s+)*class\s+([A-Za-z_$][\w$]*)")


@dataclass(frozen=True, slots=True)
class Language:
    """One language: its source file name, compile/run/version commands (argv templates), and defaults.

    - ``source_file``: the file the completion is written to, in ``{dir}`` (may use ``{class}``).
    - ``compile``: argv of the compile step, or ``None`` (nothing to compile).
    - ``run``: argv of one run (one fresh process per test case).
    - ``version``: argv that prints the toolchain's version; it must exit 0 where the
      toolchain works (checked once per session, before any scoring).
    - ``env``: added to the sandbox's environment for compile, run and version.
    - ``compile_seconds``: the compile step's time limit (its own, not the cases').
    - ``time_extra_seconds``: CPU time added to every case's limit (a runtime's start, e.g. the JVM).
    - ``memory_extra_mib``: resident memory a case may use beyond the limit (a runtime's own
      overhead, e.g. the JVM's non-heap memory) before it is a memory limit.
    - ``oom_markers``: texts on stderr that mean the program ran out of memory (a failed
      allocation ends it with a runtime error otherwise).
    - ``aliases``: other names that find this entry (fence tags, dataset spellings).
    - ``min_pids``: the smallest ``Resources.pids`` its compiler and runtime work with (their
      threads count); a sandbox with fewer is refused before anything runs.
    """

    name: str
    source_file: str
    run: tuple[str, ...]
    version: tuple[str, ...]
    compile: tuple[str, ...] | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    compile_seconds: float = 30.0
    time_extra_seconds: float = 0.0
    memory_extra_mib: int = 0
    oom_markers: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    min_pids: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise SandboxValidationError(f"language name must be lower-case letters/digits, got {self.name!r}")
        for what in ("run", "version"):
            argv = getattr(self, what)
            if not isinstance(argv, tuple) or not argv or not all(isinstance(a, str) and a for a in argv):
                raise SandboxValidationError(f"{self.name}: {what} must be a non-empty tuple of non-empty str")
        if self.compile is not None and (not isinstance(self.compile, tuple) or not self.compile):
            raise SandboxValidationError(f"{self.name}: compile must be a non-empty tuple of str, or None")
        if "/" in self.source_file or not self.source_file:
            raise SandboxValidationError(f"{self.name}: source_file must be a plain file name")
        if not (self.compile_seconds > 0 and self.time_extra_seconds >= 0 and self.memory_extra_mib >= 0):
            raise SandboxValidationError(f"{self.name}: compile_seconds must be > 0, the extras >= 0")
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))

    def class_name(self, source: str) -> str:
        """Java's public class (``Main`` when there is none); other languages ignore it."""
        match = _JAVA_CLASS.search(source)
        return match.group(1) if match else "Main"


_OOM_CXX = ("std::bad_alloc",)
#: Python's compile step: the syntax only (nothing runs, nothing is written); a syntax error is one
#: line, ``solution.py:LINE:COL: SyntaxError: message``, and exit 1.
_PY_CHECK = """import os, sys
path = sys.argv[1]
name = os.path.basename(path)
try:
    compile(open(path, "rb").read(), name, "exec")
except SyntaxError as exc:
    where = "%s:%s:%s" % (name, exc.lineno or 0, exc.offset or 0)
    sys.stderr.write("%s: %s: %s\\n" % (where, type(exc).__name__, exc.msg))
    sys.exit(1)
except (ValueError, RecursionError, MemoryError) as exc:
    sys.stderr.write("%s: %s: %s\\n" % (name, type(exc).__name__, exc))
    sys.exit(1)
"""
#: The sandbox's usual PATH (Go's official install adds /usr/local/go/bin).
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_BUILTIN = (
    Language(
        name="python",
        source_file="solution.py",
        compile=("python3", "-I", "-c", _PY_CHECK, "{src}"),
        run=("python3", "-I", "{src}"),
        version=("python3", "--version"),
        compile_seconds=10.0,
        oom_markers=("MemoryError",),
        aliases=("python3", "py", "py3", "pypy", "pypy3"),
    ),
    Language(
        name="c",
        source_file="main.c",
        compile=("gcc", "-O2", "-std=gnu17", "-pipe", "-o", "{exe}", "{src}", "-lm"),
        run=("{exe}",),
        version=("gcc", "--version"),
        aliases=("gcc",),
    ),
    Language(
        name="cpp",
        source_file="main.cpp",
        compile=("g++", "-O2", "-std=gnu++17", "-pipe", "-o", "{exe}", "{src}"),
        run=("{exe}",),
        version=("g++", "--version"),
        oom_markers=_OOM_CXX,
        aliases=("c++", "cxx", "cc", "g++", "cpp17"),
    ),
    Language(
        name="java",
        source_file="{class}.java",
        compile=(
            "javac",
            "-J-XX:+UseSerialGC",
            "-J-XX:TieredStopAtLevel=1",
            "-J-Xshare:auto",
            "-encoding",
            "UTF-8",
            "-d",
            "{dir}",
            "{src}",
        ),
        run=(
            "java",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Xshare:auto",
            "-XX:-UsePerfData",
            "-Xss64m",
            "-Xmx{memory_mib}m",
            "-cp",
            "{dir}",
            "{class}",
        ),
        version=("javac", "-version"),
        compile_seconds=60.0,
        time_extra_seconds=1.0,
        memory_extra_mib=96,
        oom_markers=("java.lang.OutOfMemoryError",),
        aliases=("java8", "java11", "java17", "java21"),
        min_pids=64,
    ),
    Language(
        name="javascript",
        source_file="main.js",
        compile=("node", "--check", "{src}"),
        run=("node", "--max-old-space-size={memory_mib}", "--stack-size=65500", "{src}"),
        version=("node", "--version"),
        time_extra_seconds=0.2,
        memory_extra_mib=32,
        oom_markers=("JavaScript heap out of memory",),
        aliases=("js", "node", "nodejs"),
    ),
    Language(
        name="go",
        source_file="main.go",
        compile=("go", "build", "-o", "{exe}", "{src}"),
        run=("{exe}",),
        version=("go", "version"),
        env={
            "PATH": _PATH + ":/usr/local/go/bin",
            "GOCACHE": "{cache}/go-build",
            "HOME": "{dir}/home",
            "GOPATH": "{dir}/gopath",
            "GOTOOLCHAIN": "local",
            "GOPROXY": "off",
            "GOFLAGS": "-buildvcs=false",
            "GOTELEMETRY": "off",
            "CGO_ENABLED": "0",
        },
        compile_seconds=60.0,
        oom_markers=("runtime: out of memory",),
        aliases=("golang",),
        min_pids=64,
    ),
    Language(
        name="rust",
        source_file="main.rs",
        compile=("rustc", "-O", "--edition", "2021", "-o", "{exe}", "{src}"),
        run=("{exe}",),
        version=("rustc", "--version"),
        compile_seconds=60.0,
        oom_markers=("memory allocation of",),
        aliases=("rs", "rustc"),
    ),
)

_lock = threading.Lock()
_table: dict[str, Language] = {lang.name: lang for lang in _BUILTIN}
_aliases: dict[str, str] = {alias: lang.name for lang in _BUILTIN for alias in lang.aliases}
#: The languages the judge knows, by name (read-only view; ``register_language`` changes it).
LANGUAGES: Mapping[str, Language] = MappingProxyType(_table)


def register_language(language: Language) -> None:
    """Add ``language`` to the table, or replace the entry of the same name (its aliases point to it)."""
    if not isinstance(language, Language):
        raise SandboxValidationError(f"register_language takes a Language, got {type(language).__name__}")
    with _lock:
        _table[language.name] = language
        for alias in language.aliases:
            _aliases[alias] = language.name


def get_language(language: str | Language) -> Language:
    """The entry for a name or alias (case-insensitive), or ``language`` itself; ``SandboxValidationError`` else."""
    if isinstance(language, Language):
        return language
    if not isinstance(language, str):
        raise SandboxValidationError(f"language must be a name or a Language, got {type(language).__name__}")
    key = language.strip().lower()
    found = _table.get(key) or _table.get(_aliases.get(key, ""))
    if found is None:
        known = ", ".join(sorted(_table))
        raise SandboxValidationError(f"unknown language {language!r}; known: {known} (or register_language)")
    return found
