"""``Sandbox.upload``/``download``: a directory as one archive stream, unpacked safely on the other side.

One ``run_python`` per transfer carries this package's ``_archive`` source into the sandbox: for an
upload it unpacks the archive it reads on its stdin into the remote directory, for a download it
packs the remote directory onto its stdout. The host packs and unpacks with the same code, in a
worker thread. Neither side trusts what the other sent (``_archive``): no path outside the target,
no symlink followed, no device node, FIFO or hard link made, sizes bounded (``max_bytes`` of file
data, ``max_members`` entries). Needs ``python3`` in the sandbox (the local backend's agent is one).
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from . import _archive
from ._errors import SandboxFileError, SandboxValidationError
from ._validate import validate_count, validate_path, validate_timeout

if TYPE_CHECKING:
    from ._sandbox import Sandbox

__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_MAX_MEMBERS", "Transfer", "download", "upload"]

#: Bounds of one transfer, by default: file data, and entries (files, directories, links).
DEFAULT_MAX_BYTES = 256 << 20
DEFAULT_MAX_MEMBERS = 100_000
#: Room for the archive's own headers on top of the file data (a PAX header is 1-2 KiB at most).
HEADER_BYTES = 2048
#: The exit code of the in-sandbox side when it refused the archive or the tree (its reason on stderr).
REFUSED = 3

_SOURCE = Path(_archive.__file__).read_text(encoding="utf-8")


@dataclass(frozen=True)
class Transfer:
    """What one upload or download moved: regular ``files``, their ``bytes``, and the paths ``skipped``
    (relative to the source directory: not a directory, regular file or symlink that stays inside)."""

    files: int
    bytes: int
    skipped: tuple[str, ...] = ()


def _limits(max_bytes: int, max_members: int) -> tuple[int, int]:
    return validate_count(max_bytes, "max_bytes"), validate_count(max_members, "max_members")


async def upload(
    sb: Sandbox,
    local_dir: str | Path,
    remote_dir: str,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_members: int = DEFAULT_MAX_MEMBERS,
    timeout_seconds: float | None = None,
) -> Transfer:
    """See ``Sandbox.upload``."""
    remote = validate_path(remote_dir, "remote_dir")
    limit, members = _limits(max_bytes, max_members)
    timeout = validate_timeout(timeout_seconds, default=sb.defaults.operation_timeout_seconds)
    buf = io.BytesIO()
    try:
        skipped = await anyio.to_thread.run_sync(_archive.pack, str(local_dir), buf, limit)
    except _archive.ArchiveError as exc:
        raise SandboxValidationError(f"upload: {exc}") from None
    except OSError as exc:
        raise SandboxValidationError(f"upload: {local_dir}: {exc.strerror or exc}") from None
    code = (
        f"{_SOURCE}\nimport json as _j, sys as _s\n"
        f"try:\n    _r = unpack(_s.stdin.buffer, {remote!r}, {limit!r}, {members!r})\n"
        f"except (ArchiveError, OSError) as _e:\n    _s.stderr.write(str(_e))\n    raise SystemExit({REFUSED})\n"
        "print(_j.dumps(_r))\n"
    )
    r = await sb.run_python(code, stdin=buf.getvalue(), timeout_seconds=timeout, max_output_bytes=1 << 16)
    if r.returncode != 0:
        raise SandboxFileError(f"upload to {remote}: {r.stderr.strip()[-2000:]}", sandbox_id=sb.sandbox_id, path=remote)
    files, total = json.loads(r.stdout)
    return Transfer(files=int(files), bytes=int(total), skipped=tuple(skipped))


async def download(
    sb: Sandbox,
    remote_dir: str,
    local_dir: str | Path,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_members: int = DEFAULT_MAX_MEMBERS,
    timeout_seconds: float | None = None,
) -> Transfer:
    """See ``Sandbox.download``."""
    remote = validate_path(remote_dir, "remote_dir")
    limit, members = _limits(max_bytes, max_members)
    timeout = validate_timeout(timeout_seconds, default=sb.defaults.operation_timeout_seconds)
    code = (
        f"{_SOURCE}\nimport json as _j, sys as _s\n"
        f"try:\n    _k = pack({remote!r}, _s.stdout.buffer, {limit!r})\n"
        f"except (ArchiveError, OSError) as _e:\n    _s.stderr.write(str(_e))\n    raise SystemExit({REFUSED})\n"
        "_s.stdout.flush()\n_s.stderr.write(_j.dumps(_k))\n"
    )
    cap = limit + (members + 2) * HEADER_BYTES
    r = await sb.run_python(code, timeout_seconds=timeout, max_output_bytes=cap)
    if r.truncated:
        raise SandboxFileError(f"download of {remote}: larger than {cap} bytes", sandbox_id=sb.sandbox_id, path=remote)
    if r.returncode != 0:
        raise SandboxFileError(
            f"download of {remote}: {r.stderr.strip()[-2000:]}", sandbox_id=sb.sandbox_id, path=remote
        )
    try:
        skipped = [str(p) for p in json.loads(r.stderr)]
    except ValueError:
        skipped = []  # a program's writes cannot reach this stderr; a malformed list only loses the names
    try:
        files, total = await anyio.to_thread.run_sync(
            _archive.unpack, io.BytesIO(r.stdout_bytes), str(local_dir), limit, members
        )
    except _archive.ArchiveError as exc:
        raise SandboxFileError(f"download of {remote}: {exc}", sandbox_id=sb.sandbox_id, path=remote) from None
    except OSError as exc:
        raise SandboxFileError(
            f"download into {local_dir}: {exc.strerror or exc}", sandbox_id=sb.sandbox_id, path=remote
        ) from None
    return Transfer(files=files, bytes=total, skipped=tuple(skipped))
