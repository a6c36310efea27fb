"""The agent's file operations (stdlib only).

Paths resolve inside the sandbox's own mount namespace, with the sandbox user's
rights: ``..`` and symlinks can only lead to what the sandbox itself can see,
and writes outside its writable directories fail with the kernel's error (for
example "Read-only file system"). Only regular files are read or written: a FIFO,
a device or a pipe (``/proc/self/fd/1`` is the agent's channel) is refused, and
opening never blocks. Every failure is a ``FileOpError`` whose message
names the path as the caller gave it.
"""

from __future__ import annotations

import os
import stat

READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
#: O_NONBLOCK: a FIFO planted at the path must fail (ENXIO), not block the agent.
WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


class FileOpError(Exception):
    """A file operation failed; the message is for the client."""


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to a blocking fd (``OSError`` as the kernel reports it)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def map_path(path_map: list[tuple[str, str]], path: str) -> str:
    """Translate a sandbox path through ``path_map`` (used only without isolation)."""
    for inside, outside in path_map:
        if path == inside or path.startswith(inside.rstrip("/") + "/"):
            return str(outside) + path[len(inside.rstrip("/")) :]
    return path


def read_file(path: str, shown: str, limit: int) -> bytes:
    """A regular file's bytes, at most ``limit`` of them."""
    try:
        fd = os.open(path, READ_FLAGS)
    except OSError as exc:
        raise FileOpError(f"{shown}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise FileOpError(f"{shown}: is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise FileOpError(f"{shown}: not a regular file")
        if st.st_size > limit:
            raise FileOpError(f"{shown}: {st.st_size} bytes is more than {limit}")
        chunks: list[bytes] = []
        total = 0
        while True:  # /proc files say size 0: read up to the limit and one byte more
            data = os.read(fd, min(1 << 20, limit + 1 - total))
            if not data:
                return b"".join(chunks)
            total += len(data)
            chunks.append(data)
            if total > limit:
                raise FileOpError(f"{shown}: more than {limit} bytes")
    except OSError as exc:
        raise FileOpError(f"{shown}: {exc.strerror}") from None
    finally:
        os.close(fd)


def write_file(path: str, shown: str, data: bytes, file_limit: int | None) -> None:
    """Create or replace a file, creating its parent directories."""
    if file_limit and len(data) > file_limit:
        raise FileOpError(f"{shown}: {len(data)} bytes is over the file size limit")
    try:
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        fd = os.open(path, WRITE_FLAGS, 0o644)
        try:
            # Only a regular file: never a pipe (say a symlink to /proc/self/fd/1, the agent's own
            # channel to the driver), a FIFO or a device. Truncate only once that is known.
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise FileOpError(f"{shown}: not a regular file")
            os.set_blocking(fd, True)
            os.ftruncate(fd, 0)
            write_all(fd, data)
        finally:
            os.close(fd)
    except OSError as exc:
        raise FileOpError(f"{shown}: {exc.strerror}") from None
