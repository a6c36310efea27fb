"""Files through exec streams, checked end to end (kubernetes.md section 6).

Write: the data goes to ``head -c N > path`` on stdin (so the command ends after
exactly N bytes on v4, which cannot half-close, and on v5 alike), then the script
prints the file's size; the write succeeded only if the exit code is 0 *and* the size
is N. Read: the script reports the size on stderr before ``cat``; the read succeeded
only if exactly that many bytes arrived. A stream that ends without a status is a
broken transport (``SandboxTransportError``, decided by the caller); with the status
in, a size mismatch means the file changed meanwhile (the program's doing:
``SandboxFileError``), never silently short data. Only regular files are read or
replaced: a FIFO or device planted at the path is refused (``SandboxFileError``)
instead of blocking until the file deadline and looking like a broken transport. The path is passed as ``$1``,
never interpolated into the script. The image needs ``sh``, ``head``, ``cat``, ``wc``,
``mkdir`` and ``dirname`` (busybox is enough).
"""

from __future__ import annotations

from ..._errors import SandboxFileError, SandboxTransportError
from ._inpod import in_session

__all__ = ["READ_SCRIPT", "WRITE_SCRIPT", "read_argv", "read_result", "write_argv", "write_result"]

WRITE_SCRIPT = (
    '{ [ ! -e "$1" ] || [ -f "$1" ]; } || { echo "$1: Not a regular file" >&2; exit 22; }; '
    'exec 3>&1; d=$(dirname -- "$1") && mkdir -p -- "$d" && head -c "$2" > "$1" && wc -c < "$1"'
)
READ_SCRIPT = (
    'if [ -d "$1" ]; then echo "$1: Is a directory" >&2; exit 21; fi; '
    '[ -e "$1" ] || { echo "$1: No such file or directory" >&2; exit 2; }; '
    '[ -f "$1" ] || { echo "$1: Not a regular file" >&2; exit 22; }; '
    '[ -r "$1" ] || { echo "$1: Permission denied" >&2; exit 13; }; '
    's=$(wc -c < "$1") || exit 5; echo "$s" >&2; '
    '[ "$s" -le "$2" ] || exit 27; exec cat -- "$1"'
)


def write_argv(path: str, size: int) -> list[str]:
    return in_session(WRITE_SCRIPT, path, str(size))


def read_argv(path: str, max_bytes: int) -> list[str]:
    return in_session(READ_SCRIPT, path, str(max_bytes))


def _why(stderr: bytes) -> str:
    return stderr.decode(errors="replace").strip()[-300:] or "no error message"


def write_result(sandbox_id: str, path: str, size: int, returncode: int, stdout: bytes, stderr: bytes) -> None:
    """Raise unless the file now holds exactly ``size`` bytes."""
    if returncode != 0:
        raise SandboxFileError(
            f"cannot write {path} (exit {returncode}): {_why(stderr)}", sandbox_id=sandbox_id, path=path
        )
    try:
        written = int(stdout.strip() or b"-1")
    except ValueError:
        written = -1
    if written != size:  # every byte arrived (head ended, the status came): the file changed meanwhile
        raise SandboxFileError(
            f"{path} changed while it was being written ({written} of {size} bytes there)",
            sandbox_id=sandbox_id,
            path=path,
        )


def read_result(
    sandbox_id: str, path: str, max_bytes: int, returncode: int, stdout: bytes, stderr: bytes, truncated: bool
) -> bytes:
    """The file's bytes, or ``SandboxFileError``/``SandboxTransportError`` as the module docstring says."""
    if returncode == 27:
        raise SandboxFileError(f"{path} is larger than {max_bytes} bytes", sandbox_id=sandbox_id, path=path)
    if returncode != 0:
        raise SandboxFileError(
            f"cannot read {path} (exit {returncode}): {_why(stderr)}", sandbox_id=sandbox_id, path=path
        )
    try:
        size = int(stderr.strip().splitlines()[0])
    except (ValueError, IndexError):
        raise SandboxTransportError(f"read of {path}: no size reported", sandbox_id=sandbox_id) from None
    if truncated or len(stdout) > size:
        raise SandboxFileError(f"{path} grew while it was being read", sandbox_id=sandbox_id, path=path)
    if len(stdout) < size:  # cat ended and its status came: the file shrank while it was being read
        raise SandboxFileError(
            f"{path} shrank while it was being read ({len(stdout)} of {size} bytes)", sandbox_id=sandbox_id, path=path
        )
    return stdout
