"""File operations, run by a fork of PID 1 for the driver (stdlib only; see ``child``).

Paths resolve inside the sandbox's own mount namespace, with the sandbox user's rights: ``..``
and symlinks can only lead to what the sandbox itself can see, and writes outside its writable
directories fail with the kernel's error (for example "Read-only file system"). Only regular
files are read or written: a FIFO, a device or a pipe is refused, and so is any of the helper's
own descriptors (a symlink to ``/proc/self/fd/1`` planted at the path would reach its result
memfd), and opening never blocks. The bytes move between the file and the driver's
memfds inside the kernel (``sendfile``) where it can, so the helper never holds a large file.
Every failure is a ``FileOpError`` whose message names the path as the caller gave it.
"""

from __future__ import annotations

import errno
import os
import stat

READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
#: O_NONBLOCK: a FIFO planted at the path must fail (ENXIO), not block the helper.
WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
#: Bytes moved per ``sendfile`` call.
CHUNK = 1 << 24


class FileOpError(Exception):
    """A file operation failed; the message is for the client."""


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to a blocking fd (``OSError`` as the kernel reports it)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def copy(src: int, dst: int, limit: int | None, offset: int | None = None) -> int:
    """Copy ``src`` (from ``offset``, else its own position) to ``dst`` until EOF; the byte count.

    Stops with ``FileOpError`` past ``limit`` bytes (one byte more is read to know). ``sendfile``
    where the kernel allows it, else read and write (``/proc`` files, for one)."""
    total = 0
    while limit is None or total <= limit:
        want = CHUNK if limit is None else min(CHUNK, limit + 1 - total)
        try:
            n = os.sendfile(dst, src, None if offset is None else offset + total, want)
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                raise
            data = os.pread(src, want, offset + total) if offset is not None else os.read(src, want)
            write_all(dst, data)
            n = len(data)
        if n == 0:
            return total
        total += n
    raise FileOpError(f"more than {limit} bytes")


def identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _check_regular(fd: int, shown: str, own: set[tuple[int, int]]) -> os.stat_result:
    st = os.fstat(fd)
    if stat.S_ISDIR(st.st_mode):
        raise FileOpError(f"{shown}: is a directory")
    if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) in own:
        raise FileOpError(f"{shown}: not a regular file")
    return st


def read_file(path: str, shown: str, limit: int, out: int, own: set[tuple[int, int]]) -> None:
    """Copy a regular file of at most ``limit`` bytes to ``out`` (never one of ``own``: see the module docstring)."""
    try:
        fd = os.open(path, READ_FLAGS)
    except OSError as exc:
        raise FileOpError(f"{shown}: {exc.strerror}") from None
    try:
        st = _check_regular(fd, shown, own)
        if st.st_size > limit:
            raise FileOpError(f"{shown}: {st.st_size} bytes is more than {limit}")
        try:
            copy(fd, out, limit)  # /proc files say size 0: copy up to the limit and one byte more
        except FileOpError:
            raise FileOpError(f"{shown}: more than {limit} bytes") from None
    except OSError as exc:
        raise FileOpError(f"{shown}: {exc.strerror}") from None
    finally:
        os.close(fd)


def write_file(path: str, shown: str, src: int, offset: int, file_limit: int | None, own: set[tuple[int, int]]) -> None:
    """Create or replace a file with ``src``'s bytes from ``offset`` on, creating its parent directories
    (never one of ``own``: see the module docstring)."""
    size = os.fstat(src).st_size - offset
    if file_limit and size > file_limit:
        raise FileOpError(f"{shown}: {size} bytes is over the file size limit")
    try:
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        fd = os.open(path, WRITE_FLAGS, 0o644)
        try:
            # Only a regular file: never a pipe, a FIFO, a device, or one of the helper's own
            # descriptors (a symlink to /proc/self/fd/1). Truncate only once that is known.
            _check_regular(fd, shown, own)
            os.set_blocking(fd, True)
            os.ftruncate(fd, 0)
            copy(src, fd, None, offset)
        finally:
            os.close(fd)
    except OSError as exc:
        raise FileOpError(f"{shown}: {exc.strerror}") from None
