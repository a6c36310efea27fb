"""File-system steps that never follow a symlink out of a root (``openat``-style).

A path inside a layer is walked one component at a time from the root's descriptor with
``O_NOFOLLOW | O_DIRECTORY``: a component that is a symlink (or not a directory) stops the walk
with :class:`Escape`, so nothing is ever written through a link, wherever it points.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from pathlib import Path

__all__ = ["DirCache", "Escape", "remove_at", "remove_tree", "split_member_path"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Escape(Exception):
    """A path that would leave the root, or pass through something that is not a directory."""


def split_member_path(name: str) -> tuple[str, ...]:
    """A tar member's name -> its components; ``Escape`` for an absolute path or any ``..``.

    ``./`` prefixes and empty components are dropped; the root itself is ``()``.
    """
    if name.startswith("/"):
        raise Escape(f"{name!r} is an absolute path")
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    if ".." in parts:
        raise Escape(f"{name!r} contains '..'")
    if any("\0" in p for p in parts):
        raise Escape(f"{name!r} contains a NUL byte")
    return parts


class DirCache:
    """Descriptors of directories under one root, opened without following links.

    :meth:`forget` a path once it is removed (a cached directory that is gone would only lose
    writes, never let them escape, but entries would go missing)."""

    def __init__(self, root_fd: int) -> None:
        self._root = root_fd
        self._fds: dict[tuple[str, ...], int] = {}

    def open(self, parts: tuple[str, ...], *, create: bool) -> int:
        """The descriptor of directory ``parts`` (created 0755 where missing if ``create``).

        Raises ``Escape`` when a component is a symlink or not a directory, ``FileNotFoundError``
        when one is missing and ``create`` is false. The cache owns the descriptor."""
        if not parts:
            return self._root
        found = self._fds.get(parts)
        if found is not None:
            return found
        if len(self._fds) > 256:
            self.clear()
        parent = self.open(parts[:-1], create=create)
        name = parts[-1]
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                raise
            os.mkdir(name, 0o755, dir_fd=parent)
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise Escape(f"'{'/'.join(parts)}' is a symlink or not a directory") from exc
            raise
        self._fds[parts] = fd
        return fd

    def forget(self, parts: tuple[str, ...]) -> None:
        """Close the descriptors of ``parts`` and everything under it (it was removed)."""
        n = len(parts)
        for key in [k for k in self._fds if k[:n] == parts]:
            os.close(self._fds.pop(key))

    def clear(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def remove_at(dir_fd: int, name: str) -> bool:
    """Remove ``name`` in ``dir_fd`` whatever it is (a directory with its content), without
    following links. True if something was there."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=dir_fd)
    else:
        os.unlink(name, dir_fd=dir_fd)
    return True


def _open_up(path: Path) -> None:
    """Give the owner rwx on every directory under ``path`` (no link followed), so it can be removed.

    Each child directory is opened up before the walk reads it (a mode 000 directory could not be
    listed); a name that is a symlink is left alone (``lstat``: nothing else writes here)."""
    with contextlib.suppress(OSError):
        if stat.S_ISDIR(os.lstat(path).st_mode):
            os.chmod(path, 0o700)
    for _root, dirs, _files, fd in os.fwalk(path, follow_symlinks=False):
        for name in dirs:
            with contextlib.suppress(OSError):
                if stat.S_ISDIR(os.lstat(name, dir_fd=fd).st_mode):
                    os.chmod(name, 0o700, dir_fd=fd)


def remove_tree(path: Path) -> None:
    """Remove a directory tree (an unpacked layer, a temporary one); read-only directories in it
    are opened up first when the plain removal is denied. Missing is not an error."""
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        return
    except PermissionError:
        _open_up(path)
        shutil.rmtree(path, ignore_errors=False)
