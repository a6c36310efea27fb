"""The on-disk registry of local sandboxes, so ``list``/``sweep`` find leftovers of crashed drivers.

One JSON file per sandbox, ``<state dir>/registry/<sandbox id>.json``, written
atomically (temp file + rename) when a sandbox is created and removed when it is
destroyed. The state directory is ``$XDG_RUNTIME_DIR/cwsandbox_async`` when that
is set, else ``/tmp/cwsandbox_async-<uid>``; it must be a directory owned by this
user with mode 0700 (anything else is refused, so another user cannot plant
entries). Neither place is visible inside a sandbox.

An entry records the owner (pid and its start time, so a reused pid is not taken
for the owner), the sandbox's outer process (pid, start time), tags, session id,
creation time, isolation level, the cgroups created for it, what an attaching process needs of its
defaults (``defaults``: working directory, environment, CPU budget) and whether its PID 1 listens
for attaches (``attach``; the socket is ``<sandbox id>.sock`` beside the entry, see ``_attach``). Whether a pid is
still the same process is decided by its start time in ``/proc/<pid>/stat``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import tempfile
from typing import Any

from ..._errors import SandboxBackendUnavailableError

__all__ = ["Registry", "default_state_dir", "pid_alive", "proc_start_time"]

#: OSError numbers that mean the caller's ``state_dir`` cannot be used (not the machine failing).
_CALLERS_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EROFS, errno.ENOENT, errno.ENAMETOOLONG})


def default_state_dir() -> str:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return os.path.join(runtime, "cwsandbox_async")
    return os.path.join(tempfile.gettempdir(), f"cwsandbox_async-{os.getuid()}")


def proc_start_time(pid: int) -> int | None:
    """The start time (clock ticks after boot) of a live process, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split()
    try:
        if fields[0] == b"Z":  # a zombie is as good as gone
            return None
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def pid_alive(pid: object, start: object) -> bool:
    """True if ``pid`` is running and is the same process that started at ``start``."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    now = proc_start_time(pid)
    return now is not None and (start is None or now == start)


class Registry:
    """Reads and writes registry entries. Every method is synchronous and small."""

    def __init__(self, state_dir: str | None = None) -> None:
        self.state_dir = state_dir or default_state_dir()
        self.dir = os.path.join(self.state_dir, "registry")
        self._ready = False

    def ensure(self) -> None:
        if self._ready:
            return
        for path in (self.state_dir, self.dir):
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                pass
            except OSError as exc:
                # No permission, a file in the way, a read-only mount: the caller's state_dir. A full
                # disk or an I/O error is the machine's.
                raise SandboxBackendUnavailableError(
                    f"cannot create the state directory {path}: {exc}",
                    infrastructure=exc.errno not in _CALLERS_ERRNOS,
                ) from exc
            st = os.lstat(path)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
                raise SandboxBackendUnavailableError(
                    f"{path} must be a directory owned by uid {os.getuid()} with mode 0700; "
                    "remove it or pass state_dir= to LocalBackend",
                    infrastructure=False,
                )
        self._ready = True

    def _path(self, sandbox_id: str) -> str:
        return os.path.join(self.dir, f"{sandbox_id}.json")

    def write(self, entry: dict[str, Any]) -> None:
        """Create or replace an entry atomically. Raises ``SandboxBackendUnavailableError`` on I/O errors."""
        self.ensure()
        path = self._path(str(entry["sandbox_id"]))
        tmp = f"{path}.{os.getpid()}.tmp"
        data = json.dumps(entry, separators=(",", ":")).encode()
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
            try:  # raw calls: two per sandbox on its way up, where a text file's setup costs as much again
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise SandboxBackendUnavailableError(f"cannot write the registry entry {path}: {exc}") from exc

    def socket_path(self, sandbox_id: str) -> str:
        """Where the sandbox's PID 1 listens for attaches (``_attach``), next to its entry."""
        return os.path.join(self.dir, f"{sandbox_id}.sock")

    def remove(self, sandbox_id: str) -> None:
        """Remove the entry and its attach socket (missing ones are no error)."""
        for path in (self._path(sandbox_id), self.socket_path(sandbox_id)):
            with contextlib.suppress(OSError):
                os.unlink(path)

    def read(self, sandbox_id: str) -> dict[str, Any] | None:
        try:
            with open(self._path(sandbox_id)) as f:
                entry = json.load(f)
        except (OSError, ValueError):
            return None
        return entry if isinstance(entry, dict) and entry.get("sandbox_id") == sandbox_id else None

    def read_all(self) -> list[dict[str, Any]]:
        """Every readable entry (unreadable or half-written files are skipped)."""
        try:
            names = os.listdir(self.dir)
        except OSError:
            return []
        out = []
        for name in names:
            if name.endswith(".json"):
                entry = self.read(name[: -len(".json")])
                if entry is not None:
                    out.append(entry)
        return out
