"""The cache's layout on disk, and its records. Everything is written to a temporary name in
the cache's own file system and renamed into place, so a reader sees all or nothing.

```
<cache>/                        mode 0700: other host users see nothing
  blobs/sha256/<hex>            manifests and configs (and layer blobs while they are unpacked)
  layers/sha256/<diff_id hex>/  an unpacked layer, shared by every image that has it
  layers/sha256/<hex>.json      its size, entry count, and the owners single-uid mode dropped
  images/<key>.json             one record per (reference, platform): digests, layers; mtime = last use
  locks/                        flock files (``_locks``): ``cache``, ``layer-<hex>``, ``blob-<hex>``
  tmp/                          downloads and unpacks in progress
```

A layer directory exists only once it is complete, and an image record only once all its
layers do; a crash leaves at most entries in ``tmp/`` (removed by the next prune).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ._options import Platform

__all__ = ["Cache", "ImageRecord"]


@dataclass(frozen=True)
class ImageRecord:
    """What the cache knows of one pulled image. ``last_used`` is a POSIX time."""

    reference: str
    platform: Platform
    digest: str
    config_digest: str
    diff_ids: tuple[str, ...]
    size_bytes: int
    last_used: float


def _hex(digest: str) -> str:
    return digest.split(":", 1)[1]


class Cache:
    """Paths and records under one cache directory (no network, no locking of its own)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def ensure(self) -> None:
        """Create the layout (the root 0700). Raises ``OSError`` if the directory cannot be made."""
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        for sub in ("blobs/sha256", "layers/sha256", "images", "locks", "tmp"):
            (self.root / sub).mkdir(parents=True, exist_ok=True, mode=0o700)

    def blob_path(self, digest: str) -> Path:
        return self.root / "blobs" / "sha256" / _hex(digest)

    def layer_path(self, diff_id: str) -> Path:
        return self.root / "layers" / "sha256" / _hex(diff_id)

    def layer_meta_path(self, diff_id: str) -> Path:
        return self.root / "layers" / "sha256" / f"{_hex(diff_id)}.json"

    def lock_path(self, name: str) -> Path:
        return self.root / "locks" / name

    def layer_lock(self, diff_id: str) -> Path:
        return self.lock_path(f"layer-{_hex(diff_id)}")

    def blob_lock(self, digest: str) -> Path:
        return self.lock_path(f"blob-{_hex(digest)}")

    def tmp_dir(self, prefix: str) -> Path:
        return Path(tempfile.mkdtemp(prefix=prefix, dir=self.root / "tmp"))

    def write_atomic(self, path: Path, data: bytes) -> None:
        """Write ``data`` to ``path`` through a temporary file in the same directory and a rename."""
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    # -- image records ---------------------------------------------------------------------------
    def record_path(self, reference: str, platform: Platform) -> Path:
        key = hashlib.sha256(f"{reference}|{platform}".encode()).hexdigest()
        return self.root / "images" / f"{key}.json"

    def write_record(self, record: ImageRecord) -> None:
        data = {
            "reference": record.reference,
            "platform": str(record.platform),
            "digest": record.digest,
            "config_digest": record.config_digest,
            "diff_ids": list(record.diff_ids),
            "size_bytes": record.size_bytes,
        }
        self.write_atomic(self.record_path(record.reference, record.platform), json.dumps(data).encode())

    def read_record(self, path: Path) -> ImageRecord | None:
        """The record at ``path``; None if it is gone or unreadable (a record being replaced)."""
        try:
            data = json.loads(path.read_bytes())
            last_used = path.stat().st_mtime
            return ImageRecord(
                reference=str(data["reference"]),
                platform=Platform.parse(str(data["platform"])),
                digest=str(data["digest"]),
                config_digest=str(data["config_digest"]),
                diff_ids=tuple(str(d) for d in data["diff_ids"]),
                size_bytes=int(data["size_bytes"]),
                last_used=last_used,
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def find_record(self, reference: str, platform: Platform) -> ImageRecord | None:
        return self.read_record(self.record_path(reference, platform))

    def records(self) -> list[ImageRecord]:
        """Every readable image record, least recently used first."""
        found = [self.read_record(p) for p in (self.root / "images").glob("*.json")]
        return sorted((r for r in found if r is not None), key=lambda r: r.last_used)

    def touch(self, record: ImageRecord) -> None:
        """Mark ``record`` used now (its file's mtime is its last use)."""
        with contextlib.suppress(FileNotFoundError):
            now = time.time()
            os.utime(self.record_path(record.reference, record.platform), (now, now))

    def layer_size(self, diff_id: str) -> int:
        """The bytes an unpacked layer takes, as its meta file says (0 if unknown)."""
        try:
            return int(json.loads(self.layer_meta_path(diff_id).read_bytes())["disk_bytes"])
        except (OSError, ValueError, KeyError, TypeError):
            return 0

    def complete(self, record: ImageRecord) -> bool:
        """Whether every layer of ``record`` is unpacked and its config blob is there."""
        return self.blob_path(record.config_digest).is_file() and all(
            self.layer_path(d).is_dir() for d in record.diff_ids
        )
