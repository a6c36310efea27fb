"""Run a Python program in a sandbox with as few backend calls as possible."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from .._errors import (
    SandboxError,
    SandboxNotRunningError,
    SandboxTerminatedError,
    SandboxTimeoutError,
    SandboxTransportError,
)

if TYPE_CHECKING:
    from .._sandbox import Sandbox
    from .._types import ExecResult

__all__ = ["INLINE_SOURCE_LIMIT", "programs_doing", "run_python"]

#: Programs up to this many bytes go on the command line (``python3 -c``); larger ones are written to a file first.
#: Linux caps one argument at 128 KiB.
INLINE_SOURCE_LIMIT = 100_000


#: The errors an exec raises that can be the program's own doing (when not ``infrastructure``): its timeout,
#: and a sandbox or channel it took down with it. Every other error is the platform's or the caller's.
_PROGRAM_ERRORS = (SandboxTimeoutError, SandboxNotRunningError, SandboxTransportError)


def programs_doing(exc: SandboxError) -> bool:
    """Whether an error an exec of the program raised is the program's own outcome (scored, not raised).

    True for a non-infrastructure timeout, dead sandbox or broken channel; False for
    infrastructure failures and for everything else (a stopped sandbox is the
    caller's doing, bad input the caller's mistake, an unknown class a bug).
    """
    return isinstance(exc, _PROGRAM_ERRORS) and not exc.infrastructure and not isinstance(exc, SandboxTerminatedError)


async def run_python(
    sandbox: Sandbox,
    source: str,
    *,
    timeout_seconds: float,
    python: str = "python3",
    cwd: str | None = None,
    stdin: bytes | None = None,
    exclusive: bool = False,
    cpu_seconds: float | None = None,
    cpu_priority: bool = False,
    isolated: bool = False,
) -> ExecResult:
    """Run ``source`` with the sandbox's Python and return the result (a non-zero exit is a result).

    Small programs take one call: ``Sandbox.run_python`` (the local backend forks a
    warm interpreter) or ``<python> -c`` for another interpreter; large ones (or
    ones with NUL bytes) are written to a file in /tmp first and run from it.
    ``stdin`` is the program's standard input; ``exclusive`` kills every other
    process in the sandbox first (``Sandbox.exec``). Raises what ``Sandbox.exec`` raises:
    ``SandboxTimeoutError`` when the program runs past ``timeout_seconds`` (not an
    infrastructure failure unless the program was starved of CPU; ``.result`` has
    its output so far), ``SandboxNotRunningError``/``SandboxTransportError`` when
    the sandbox or its channel fails. ``cpu_seconds``: a CPU-time budget; ``cpu_priority``: the
    sandbox gets the CPU before other sandboxes while it runs, where the backend can (with
    ``exclusive`` and ``cpu_seconds`` only; ``Sandbox.exec``).
    """
    small = len(source.encode("utf-8", errors="surrogatepass")) <= INLINE_SOURCE_LIMIT and "\x00" not in source
    if small and python == "python3":
        return await sandbox.run_python(
            source,
            timeout_seconds=timeout_seconds,
            cwd=cwd,
            stdin=stdin,
            exclusive=exclusive,
            cpu_seconds=cpu_seconds,
            cpu_priority=cpu_priority,
        )
    flags = ["-I"] if isolated else []
    argv = [python, *flags, "-c", source]
    if not small:
        argv = [python, *flags, f"/tmp/cwsandbox_{uuid.uuid4().hex[:12]}.py"]
        await sandbox.write_file(argv[-1], source)
    return await sandbox.exec(
        argv,
        timeout_seconds=timeout_seconds,
        cwd=cwd,
        stdin=stdin,
        exclusive=exclusive,
        cpu_seconds=cpu_seconds,
        cpu_priority=cpu_priority,
    )
