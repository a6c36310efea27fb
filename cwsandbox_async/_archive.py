"""Directory archives for ``Sandbox.upload``/``download``: packed from a tree, unpacked into one safely.

Stdlib only: this module's own source also runs inside a sandbox (``Sandbox.run_python``), where it
packs a directory for a download (``pack``) or unpacks an upload (``unpack``). One implementation
unpacks on both sides, and it trusts no archive:

- every member's name is relative, normalised, without ``..``, NUL or an empty part; anything else
  is refused (``ArchiveError``), before anything of it is written;
- only directories, regular files and symlinks whose target stays inside the target directory (a
  relative target that does not climb above it) are made; a device, a FIFO, a hard link or a
  symlink that leads out is refused;
- nothing is followed: every step opens the next directory with ``O_NOFOLLOW | O_DIRECTORY``
  relative to the one before (``dir_fd``), and a file is opened with ``O_NOFOLLOW | O_NONBLOCK``, so
  a symlink already in the target (or made by an earlier member) is never walked through, and an
  existing FIFO or device is never written; a file is truncated only once it is known to be regular;
- modes keep the permission bits only (no setuid, setgid or sticky bit), owners are never set;
- sizes are bounded: the archive's total (``max_bytes``) and its number of members (``max_members``).

``pack`` walks without following symlinks (``lstat``) and stores directories, regular files and
symlinks that stay inside the tree (as links, never their targets); anything else (a device, a FIFO,
a socket, a symlink leading out) is left out and named in what it returns.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import stat
import tarfile

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import IO

#: Permission bits kept from an archive (``0o777``: never setuid, setgid or sticky).
MODE_BITS = 0o777


class ArchiveError(Exception):
    """An archive or a tree this module refuses (the message names the member or path)."""


def _parts(name: str) -> list[str]:
    """The parts of a member's name, refused unless it is relative and stays inside."""
    if not name or "\0" in name or name.startswith("/"):
        raise ArchiveError(f"{name!r}: not a relative path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise ArchiveError(f"{name!r}: climbs out of the target directory")
    return parts


def _link_stays_inside(parts: list[str], target: str) -> bool:
    """Whether a symlink at ``parts`` pointing at ``target`` resolves inside the target directory."""
    if not target or target.startswith("/") or "\0" in target:
        return False
    depth = len(parts) - 1  # the link's directory, below the root
    for p in target.split("/"):
        if p in ("", "."):
            continue
        depth += -1 if p == ".." else 1
        if depth < 0:
            return False
    return True


def pack(root: str, out: IO[bytes], max_bytes: int) -> list[str]:
    """Write a tar of the tree at ``root`` (its contents, names relative to it) to ``out``; the paths left
    out (neither a directory, a regular file nor a symlink). ``ArchiveError`` past ``max_bytes`` of file
    data, or when ``root`` is not a directory (symlinks to one included: the caller named it)."""
    if not os.path.isdir(root):
        raise ArchiveError(f"{root}: not a directory")
    skipped: list[str] = []
    total = 0
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for top, dirs, files in os.walk(root, followlinks=False):
            dirs.sort()
            for name in sorted(dirs) + sorted(files):
                full = os.path.join(top, name)
                rel = os.path.relpath(full, root)
                st = os.lstat(full)
                info = tarfile.TarInfo(rel)
                info.mode = st.st_mode & MODE_BITS
                info.mtime = int(st.st_mtime)
                if stat.S_ISDIR(st.st_mode):
                    info.type = tarfile.DIRTYPE
                    tar.addfile(info)
                elif stat.S_ISLNK(st.st_mode):
                    target = os.readlink(full)
                    if not _link_stays_inside(rel.split("/"), target):
                        skipped.append(rel)  # it would lead out of the tree where it lands
                        continue
                    info.type = tarfile.SYMTYPE
                    info.linkname = target
                    tar.addfile(info)
                elif stat.S_ISREG(st.st_mode):
                    fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
                    with os.fdopen(fd, "rb") as f:
                        size = os.fstat(f.fileno()).st_size
                        total += size
                        if total > max_bytes:
                            raise ArchiveError(f"{root}: more than {max_bytes} bytes of files")
                        info.size = size
                        tar.addfile(info, f)
                else:
                    skipped.append(rel)
    return skipped


def _open_dir(parent: int, name: str, create: bool, shown: str) -> int:
    """The directory ``name`` in ``parent`` (made if ``create`` and missing), never through a symlink."""
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o755, dir_fd=parent)
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise ArchiveError(f"{shown}: not a directory (a symlink or a file is in the way)") from None
        raise ArchiveError(f"{shown}: {exc.strerror}") from None


def _write(parent: int, name: str, src: IO[bytes], size: int, mode: int, shown: str) -> None:
    try:
        fd = os.open(
            name, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600, dir_fd=parent
        )
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ArchiveError(f"{shown}: a symlink is in the way") from None
        raise ArchiveError(f"{shown}: {exc.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ArchiveError(f"{shown}: not a regular file is in the way")
        os.set_blocking(fd, True)
        os.ftruncate(fd, 0)
        left = size
        while left > 0:
            chunk = src.read(min(left, 1 << 20))
            if not chunk:
                raise ArchiveError(f"{shown}: the archive ends inside it")
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view) :]
            left -= len(chunk)
        os.fchmod(fd, mode & MODE_BITS)
    except OSError as exc:
        raise ArchiveError(f"{shown}: {exc.strerror}") from None
    finally:
        os.close(fd)


def unpack(src: IO[bytes], root: str, max_bytes: int, max_members: int) -> tuple[int, int]:
    """Unpack the tar read from ``src`` into the directory ``root`` (made if missing, with its parents),
    as the module docstring says; ``(files, bytes)`` written. ``ArchiveError`` for what it refuses (what
    came before in the archive stays written)."""
    os.makedirs(root, exist_ok=True)
    base = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    files = total = members = 0
    try:
        with tarfile.open(fileobj=src, mode="r|") as tar:
            for member in tar:
                members += 1
                if members > max_members:
                    raise ArchiveError(f"more than {max_members} members")
                parts = _parts(member.name)
                if not parts:
                    continue  # the root itself
                if member.isdir():
                    kind = "dir"
                elif member.isreg():
                    kind = "file"
                    total += member.size
                    if total > max_bytes:
                        raise ArchiveError(f"more than {max_bytes} bytes of files")
                elif member.issym():
                    if not _link_stays_inside(parts, member.linkname):
                        raise ArchiveError(f"{member.name}: a symlink that leads out ({member.linkname!r})")
                    kind = "link"
                else:
                    raise ArchiveError(f"{member.name}: neither a directory, a regular file nor a symlink")
                fds: list[int] = []
                try:
                    parent = base
                    for i, part in enumerate(parts[:-1]):
                        parent = _open_dir(parent, part, True, "/".join(parts[: i + 1]))
                        fds.append(parent)
                    last = parts[-1]
                    if kind == "dir":
                        fds.append(_open_dir(parent, last, True, member.name))
                        os.chmod(fds[-1], (member.mode & MODE_BITS) | 0o700)
                    elif kind == "link":
                        try:
                            os.symlink(member.linkname, last, dir_fd=parent)
                        except OSError as exc:
                            raise ArchiveError(f"{member.name}: {exc.strerror}") from None
                    else:
                        data = tar.extractfile(member)
                        _write(
                            parent,
                            last,
                            data if data is not None else io.BytesIO(),
                            member.size,
                            member.mode,
                            member.name,
                        )
                        files += 1
                finally:
                    for fd in fds:
                        os.close(fd)
    except tarfile.TarError as exc:
        raise ArchiveError(f"not a readable archive: {exc}") from None
    finally:
        os.close(base)
    return files, total
