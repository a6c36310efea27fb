"""Unpacking one layer (a tar, gzip- or zstd-compressed or not) into the form overlayfs reads.

The on-disk form (what the local backend's overlay mounts, with the ``userxattr`` option, inside
its user namespace):

- a whiteout (``.wh.NAME``) becomes a character device 0/0 named ``NAME``: the kernel lets any
  process make that one device since Linux 5.8 (no ``CAP_MKNOD`` needed), and overlayfs reads it
  without privilege;
- an opaque directory (``.wh..wh..opq``) gets ``user.overlay.opaque=y``;
- modes (set-uid and set-gid bits removed), symlinks, hardlinks within the layer, mtimes and the
  layer's ``user.*`` xattrs are kept. ``user.overlay.*`` / ``trusted.*`` / ``security.*`` xattrs
  from the tar are not applied (a layer must not forge whiteouts, redirects or capabilities).

Ownership, single-uid mode: every file belongs to the process that unpacks (the driver); each
path's original uid/gid, when not 0/0, is recorded in the result for a later idmapped mode.

Refused, as ``ImagePullError(infrastructure=False)`` (the image's fault), with the partial tree
left for the caller to delete: absolute paths and ``..``; writing through a symlink or a
non-directory (each path is walked with ``O_NOFOLLOW`` from the root's descriptor); hardlinks to
anything not already in this layer; a tar stream or written content past ``max_bytes``; more
than ``max_entries`` entries; a corrupt archive; content whose digest is not the layer's
``diff_id``. Device nodes (block and character, the 0/0 whiteout form included) are skipped and
listed: a sandbox's ``/dev`` comes from the backend.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import os
import stat
import tarfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from .._errors import ImagePullError
from ._safefs import DirCache, Escape, remove_at, split_member_path

try:  # Python 3.14 has it in the standard library
    from compression import zstd  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # pragma: no cover - depends on the interpreter
    try:
        from backports import zstd  # type: ignore[no-redef,unused-ignore]
    except ImportError:
        zstd = None  # type: ignore[assignment,unused-ignore]

_ZSTD_ERRORS: tuple[type[Exception], ...] = (zstd.ZstdError,) if zstd is not None else ()

__all__ = ["OPAQUE_XATTR", "UnpackLimits", "UnpackResult", "unpack_layer"]

OPAQUE_XATTR = "user.overlay.opaque"
_WHITEOUT = ".wh."
_OPAQUE = ".wh..wh..opq"
_CHUNK = 1 << 20
_GZIP = b"\x1f\x8b"
_ZSTD = b"\x28\xb5\x2f\xfd"


@dataclass(frozen=True)
class UnpackLimits:
    """Bounds on one layer: bytes of the tar stream and of written content, and entries."""

    max_bytes: int
    max_entries: int


@dataclass
class UnpackResult:
    """What one unpack did: the bytes written, the entries, and what single-uid mode dropped."""

    diff_id: str = ""
    bytes: int = 0
    entries: int = 0
    owners: dict[str, tuple[int, int]] = field(default_factory=dict)
    setid_removed: list[str] = field(default_factory=list)
    devices_skipped: list[str] = field(default_factory=list)
    xattrs_dropped: int = 0


class _Refused(Exception):
    pass


class _Reader:
    """The decompressed tar stream: hashed (the diff_id) and bounded as it is read."""

    def __init__(self, inner: IO[bytes], limit: int) -> None:
        self._inner = inner
        self._limit = limit
        self.total = 0
        self.hasher = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self._inner.read(size if size >= 0 else _CHUNK)
        self.total += len(data)
        if self.total > self._limit:
            raise _Refused(f"the layer expands past {self._limit} bytes")
        self.hasher.update(data)
        return data


def _decompressed(raw: IO[bytes]) -> IO[bytes]:
    magic = raw.read(4)
    raw.seek(0)
    if magic.startswith(_GZIP):
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    if magic == _ZSTD:
        if zstd is None:
            raise ImagePullError(
                "a zstd-compressed layer needs the zstd extra (pip install 'cwsandbox-async[zstd]')",
                infrastructure=False,
            )
        return zstd.ZstdFile(raw, mode="rb")  # type: ignore[no-any-return,unused-ignore]
    return raw


class _Unpacker:
    def __init__(self, root_fd: int, limits: UnpackLimits, check_cancelled: Callable[[], None]) -> None:
        self.dirs = DirCache(root_fd)
        self.limits = limits
        self.check_cancelled = check_cancelled
        self.result = UnpackResult()
        self.dir_attrs: dict[tuple[str, ...], tarfile.TarInfo] = {}

    def member(self, tar: tarfile.TarFile, info: tarfile.TarInfo) -> None:
        self.result.entries += 1
        if self.result.entries > self.limits.max_entries:
            raise _Refused(f"the layer has more than {self.limits.max_entries} entries")
        if self.result.entries % 256 == 0:
            self.check_cancelled()
        parts = split_member_path(info.name)
        path = "/".join(parts)
        if not parts:
            return  # the root entry: the layer's root directory is ours
        if info.uid or info.gid:
            self.result.owners[path] = (info.uid, info.gid)
        base = parts[-1]
        if base == _OPAQUE:
            fd = self.dirs.open(parts[:-1], create=True)
            self._set_opaque(fd)
            return
        if base.startswith(".wh..wh."):
            return  # other AUFS bookkeeping (.wh..wh.plnk...): no meaning on overlay
        if base.startswith(_WHITEOUT):
            target = base[len(_WHITEOUT) :]
            if target in ("", ".", ".."):
                raise _Refused(f"{info.name!r} whites out nothing")
            parent = self.dirs.open(parts[:-1], create=True)
            self._clear(parent, (*parts[:-1], target))
            os.mknod(target, stat.S_IFCHR, os.makedev(0, 0), dir_fd=parent)
            return
        if info.ischr() or info.isblk():
            self.result.devices_skipped.append(path)
            return
        parent = self.dirs.open(parts[:-1], create=True)
        if info.isdir():
            self._directory(parent, parts, info)
        elif info.isreg():
            self._file(tar, parent, parts, info)
        elif info.issym():
            self._clear(parent, parts)
            os.symlink(info.linkname, base, dir_fd=parent)
            os.utime(base, ns=(_ns(info), _ns(info)), dir_fd=parent, follow_symlinks=False)
        elif info.islnk():
            self._hardlink(parent, parts, info)
        elif info.isfifo():
            self._clear(parent, parts)
            os.mkfifo(base, _mode(info, path, self.result), dir_fd=parent)
        else:
            raise _Refused(f"{info.name!r} has a tar type this unpacker does not know ({info.type!r})")

    def _clear(self, parent: int, parts: tuple[str, ...], keep_dir: bool = False) -> None:
        """Remove what is at ``parts`` (in directory ``parent``) before something replaces it."""
        try:
            st = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return
        if keep_dir and stat.S_ISDIR(st.st_mode):
            return
        self.dirs.forget(parts)
        remove_at(parent, parts[-1])

    def _set_opaque(self, fd: int) -> None:
        try:
            os.setxattr(fd, OPAQUE_XATTR, b"y")
        except OSError as exc:
            raise ImagePullError(
                f"cannot mark an opaque directory ({OPAQUE_XATTR}): the cache's file system refused user xattrs: {exc}",
                infrastructure=True,
            ) from exc

    def _directory(self, parent: int, parts: tuple[str, ...], info: tarfile.TarInfo) -> None:
        self._clear(parent, parts, keep_dir=True)
        fd = self.dirs.open(parts, create=True)
        self._xattrs(fd, info)
        self.dir_attrs[parts] = info

    def _file(self, tar: tarfile.TarFile, parent: int, parts: tuple[str, ...], info: tarfile.TarInfo) -> None:
        self._clear(parent, parts)
        fd = os.open(
            parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=parent
        )
        try:
            source = tar.extractfile(info)
            if source is not None:
                while chunk := source.read(_CHUNK):
                    self.result.bytes += len(chunk)
                    if self.result.bytes > self.limits.max_bytes:
                        raise _Refused(f"the layer's files pass {self.limits.max_bytes} bytes")
                    os.write(fd, chunk)
                    self.check_cancelled()
            self._xattrs(fd, info)
            os.fchmod(fd, _mode(info, "/".join(parts), self.result))
            os.utime(fd, ns=(_ns(info), _ns(info)))
        finally:
            os.close(fd)

    def _hardlink(self, parent: int, parts: tuple[str, ...], info: tarfile.TarInfo) -> None:
        target = split_member_path(info.linkname)
        if not target:
            raise _Refused(f"{info.name!r} links to the layer's root")
        try:
            source_dir = self.dirs.open(target[:-1], create=False)
            st = os.stat(target[-1], dir_fd=source_dir, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            raise _Refused(f"{info.name!r} is a hardlink to {info.linkname!r}, which is not in this layer") from None
        if stat.S_ISDIR(st.st_mode) or stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
            raise _Refused(f"{info.name!r} is a hardlink to a directory or a device")
        if target == parts:
            return  # a link to itself: the file is already there
        self._clear(parent, parts)
        os.link(target[-1], parts[-1], src_dir_fd=source_dir, dst_dir_fd=parent, follow_symlinks=False)

    def _xattrs(self, fd: int, info: tarfile.TarInfo) -> None:
        for key, value in info.pax_headers.items():
            if not key.startswith("SCHILY.xattr."):
                continue
            name = key[len("SCHILY.xattr.") :]
            if not name.startswith("user.") or name.startswith("user.overlay."):
                self.result.xattrs_dropped += 1
                continue
            try:
                os.setxattr(fd, name, value.encode("utf-8", "surrogateescape"))
            except OSError:
                self.result.xattrs_dropped += 1

    def finish_directories(self) -> None:
        for parts in sorted(self.dir_attrs, key=len, reverse=True):
            info = self.dir_attrs[parts]
            fd = self.dirs.open(parts, create=False)
            os.fchmod(fd, _mode(info, "/".join(parts), self.result))
            os.utime(fd, ns=(_ns(info), _ns(info)))


def _ns(info: tarfile.TarInfo) -> int:
    return int(info.mtime * 1_000_000_000)


def _mode(info: tarfile.TarInfo, path: str, result: UnpackResult) -> int:
    mode = info.mode & 0o7777
    if mode & 0o6000 and not info.isdir():
        result.setid_removed.append(path)
        mode &= ~0o6000
    return mode


def unpack_layer(
    blob: Path,
    dest: Path,
    limits: UnpackLimits,
    diff_id: str | None = None,
    check_cancelled: Callable[[], None] = lambda: None,
) -> UnpackResult:
    """Unpack the layer ``blob`` into the empty directory ``dest`` (blocking: run it in a thread).

    ``diff_id``, when given, must be the sha256 of the uncompressed tar. Raises
    ``ImagePullError``: ``infrastructure=False`` for what the layer is or does (see the module
    doc), ``True`` when the cache's file system fails (no space, no user xattrs). On any raise
    ``dest`` holds a partial tree that the caller deletes.
    """
    root_fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    unpacker = _Unpacker(root_fd, limits, check_cancelled)
    try:
        with open(blob, "rb") as raw:
            reader = _Reader(_decompressed(raw), limits.max_bytes)
            with tarfile.open(fileobj=reader, mode="r|") as tar:  # type: ignore[call-overload]
                for info in tar:
                    unpacker.member(tar, info)
            while reader.read(_CHUNK):
                pass
        unpacker.finish_directories()
    except _Refused as exc:
        raise ImagePullError(f"layer refused: {exc}", infrastructure=False) from exc
    except Escape as exc:
        raise ImagePullError(f"layer refused: {exc}", infrastructure=False) from exc
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise ImagePullError(f"layer refused: not a valid tar stream: {exc}", infrastructure=False) from exc
    except _ZSTD_ERRORS as exc:
        raise ImagePullError(f"layer refused: not a valid zstd stream: {exc}", infrastructure=False) from exc
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS):
            raise ImagePullError(f"cannot write the image cache: {exc}", infrastructure=True) from exc
        if exc.errno in (errno.ENAMETOOLONG, errno.EMLINK):
            raise ImagePullError(f"layer refused: {exc}", infrastructure=False) from exc
        raise
    finally:
        unpacker.dirs.clear()
        os.close(root_fd)
    unpacker.result.diff_id = "sha256:" + reader.hasher.hexdigest()
    if diff_id is not None and unpacker.result.diff_id != diff_id:
        raise ImagePullError(
            f"layer refused: its content is {unpacker.result.diff_id}, not the {diff_id} the image config names",
            infrastructure=False,
        )
    return unpacker.result
