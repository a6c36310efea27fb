"""``Sandbox.shell()``: a persistent shell, one exec per run, its state carried in the sandbox between runs.

Why not a long-lived shell process: its runs would end, and say their exit status, through the
shell's own output or descriptors, which every program it starts can write to or open (the same
user can open ``/proc/<shell>/fd/*`` of a dumpable process): a printed sentinel or a status fd is
forgeable. Here each ``run`` is one ``Sandbox.exec`` of ``bash``, so its end and exit status are the
backend's (locally PID 1's report, which nothing in the sandbox can write), and its output is the
exec's, under the same cap and timeout. A run's timeout kills that run's process tree and nothing
else: the shell itself is only its state.

The state (``WRAPPER``): the run sources the state file (if any), then runs the command with
``eval`` in that same bash, then writes the state back: every variable (exported ones keep their
export) but bash's own dynamic ones, the functions, the aliases, the working directory, the umask,
and the ``set -o``/``shopt`` options, last. It is written at the end of the command and on
``exit``; a run that ends otherwise (killed by its timeout, by a signal, ``exec``'d over) leaves the
state as the last run that saved it. The file lives in the sandbox's ``/tmp``: a program can change
it, as it can change any file there (a ``pytest`` script planted on ``PATH`` does as much), and so
change what later runs do; it cannot change how a run ended or what it printed.

Not carried: background jobs (``cmd &``): a run's processes end with it where the backend cleans up
an exec's process tree (locally PID 1 kills what a command leaves behind); start a server with
``Sandbox.process`` instead. Traps, ``$!``, ``$?`` of the previous run and the directory stack are
not carried either.
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING

import anyio

from ._errors import SandboxError, SandboxValidationError
from ._types import ExecResult

if TYPE_CHECKING:
    from ._sandbox import Sandbox

__all__ = ["WRAPPER", "Shell"]

#: Bash's variables that are its own (dynamic or read-only), never saved: restoring them would
#: reseed ``RANDOM``, reset ``SECONDS`` or fail.
_OWN_VARIABLES = (
    "BASHPID BASH_ARGC BASH_ARGV BASH_ARGV0 BASH_COMMAND BASH_LINENO BASH_REMATCH BASH_SOURCE "
    "BASH_SUBSHELL BASH_EXECUTION_STRING COMP_WORDBREAKS DIRSTACK EPOCHREALTIME EPOCHSECONDS FUNCNAME "
    "GROUPS HISTCMD LINENO OLDPWD OPTIND PIPESTATUS PWD RANDOM SECONDS SHLVL SRANDOM _"
)

#: The bash program of one run: ``$1`` the state file, ``$2`` the command. No external command runs
#: (no fork but the command's own).
WRAPPER = (
    'if [ -f "$1" ]; then . "$1" >/dev/null 2>&1; fi\n'
    "__cws_state=$1 __cws_cmd=$2\n"
    "set --\n"
    "__cws_save() {\n"
    "  __cws_rc=$? __cws_so=$SHELLOPTS __cws_bo=$BASHOPTS\n"
    "  trap - EXIT\n"
    "  { set +euxv; } 2>/dev/null\n"
    "  __cws_dir=$PWD\n"
    f"  unset {_OWN_VARIABLES} __cws_cmd 2>/dev/null\n"
    "  {\n"
    "    declare -p\n"
    "    declare -f\n"
    "    alias -p\n"
    "    printf 'cd -- %q\\n' \"$__cws_dir\"\n"
    "    umask -p\n"
    # the options last, two commands each: a fresh bash's own off (evaluated then), the saved ones on
    "    echo 'shopt -u ${BASHOPTS//:/ }; set +o ${SHELLOPTS//:/ +o }'\n"
    '    printf \'shopt -s %s; set -o %s\\n\' "${__cws_bo//:/ }" "${__cws_so//:/ -o }"\n'
    '  } >| "$__cws_state" 2>/dev/null\n'
    '  exit "$__cws_rc"\n'
    "}\n"
    "trap __cws_save EXIT\n"
    # a run ended by its timeout (a backend that sends SIGTERM first) keeps the state from before it
    "trap 'trap - EXIT; exit 143' TERM\n"
    'eval "$__cws_cmd"\n'
    "__cws_save\n"
)


class Shell:
    """A persistent shell in one sandbox (``Sandbox.shell``); see the module docstring.

    ``async with sb.shell() as sh: r = await sh.run("cd repo && export A=1")``. Runs are one at a
    time (a second ``run`` waits for the first). Leaving the block removes the state file.
    """

    def __init__(
        self,
        sandbox: Sandbox,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_seconds: float | None = None,
        max_output_bytes: int | None = None,
        bash: str = "bash",
    ) -> None:
        self._sandbox = sandbox
        self._cwd = cwd
        self._env = dict(env or {})
        self._timeout = timeout_seconds
        self._max_output = max_output_bytes
        self._bash = bash
        self._lock = anyio.Lock()
        self._closed = False
        #: Where the state lives between runs, in the sandbox's own ``/tmp``.
        self.state_path = f"/tmp/.cwsandbox-shell-{uuid.uuid4().hex[:16]}"

    async def run(
        self,
        command: str,
        *,
        timeout_seconds: float | None = None,
        stdin: bytes | None = None,
        max_output_bytes: int | None = None,
        check: bool = False,
    ) -> ExecResult:
        """Run ``command`` (a bash command line) in the shell's state; its result, as ``Sandbox.exec`` gives it
        (``command`` is ``("bash", "-c", command)`` in it).

        Raises as ``Sandbox.exec``: ``SandboxTimeoutError`` past ``timeout_seconds`` (the run's process
        tree is killed, the shell stays usable with the state from before the run),
        ``SandboxExecutionError`` with ``check`` and a non-zero exit, ``SandboxError`` after the shell
        was closed, ``SandboxValidationError`` for a command that is not a ``str``."""
        if not isinstance(command, str):
            raise SandboxValidationError("a shell command is a str (a bash command line)")
        if self._closed:
            raise SandboxError("the shell is closed", sandbox_id=self._sandbox.sandbox_id, infrastructure=False)
        argv = [self._bash, "--noprofile", "--norc", "-c", WRAPPER, "cwsandbox-shell", self.state_path, command]
        async with self._lock:
            result = await self._sandbox.exec(
                argv,
                timeout_seconds=self._timeout if timeout_seconds is None else timeout_seconds,
                cwd=self._cwd,
                env=self._env,
                stdin=stdin,
                check=check,
                max_output_bytes=self._max_output if max_output_bytes is None else max_output_bytes,
            )
        return dataclasses.replace(result, command=("bash", "-c", command))

    async def aclose(self) -> None:
        """Remove the state file (a sandbox that is gone has none left). Idempotent; never raises for a
        sandbox that stopped."""
        if self._closed:
            return
        self._closed = True
        async with self._lock:
            with contextlib.suppress(SandboxError):  # the sandbox stopped or broke: its /tmp went with it
                await self._sandbox.exec(["rm", "-f", "--", self.state_path], timeout_seconds=30.0)

    async def __aenter__(self) -> Shell:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        with anyio.CancelScope(shield=True):
            await self.aclose()
