"""Listing, removing and collecting: what leaves the cache, and when.

Every removal runs under the cache's lock held exclusively: no pull is writing then (pulls hold
it shared), so whatever no record names can go, except layers someone holds (``ImageLease``).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from ._cache import Cache, ImageRecord
from ._image import CachedImage, PruneResult
from ._locks import try_locked
from ._safefs import remove_tree

__all__ = ["listing", "prune_locked", "remove_locked", "sweep"]


def listing(cache: Cache) -> list[CachedImage]:
    return [
        CachedImage(r.reference, r.digest, r.platform, r.size_bytes, r.last_used)
        for r in cache.records()
        if cache.complete(r)
    ]


def remove_locked(cache: Cache, reference: str) -> bool:
    found = [r for r in cache.records() if r.reference == reference]
    for record in found:
        cache.record_path(record.reference, record.platform).unlink(missing_ok=True)
    sweep(cache, cache.records())
    return bool(found)


def _held(cache: Cache, record: ImageRecord) -> bool:
    """Whether someone holds the image (all its layers are held; a layer it only shares with a
    held image stays anyway, by the sweep)."""
    for diff_id in record.diff_ids:
        with try_locked(cache.layer_lock(diff_id)) as free:
            if free:
                return False
    return bool(record.diff_ids)


def usage(cache: Cache) -> int:
    """Bytes the cache takes: unpacked layers (as their meta files say) and blobs."""
    layers = cache.root / "layers" / "sha256"
    total = sum(cache.layer_size("sha256:" + p.name) for p in layers.iterdir() if p.is_dir())
    blobs = cache.root / "blobs" / "sha256"
    return total + sum(p.stat().st_size for p in blobs.iterdir() if p.is_file())


def prune_locked(cache: Cache, max_bytes: int, keep: str | None) -> PruneResult:
    before = usage(cache)
    records = cache.records()
    removed: list[str] = []
    sweep(cache, records)
    for record in list(records):
        if usage(cache) <= max_bytes:
            break
        if record.digest == keep or _held(cache, record):
            continue
        cache.record_path(record.reference, record.platform).unlink(missing_ok=True)
        records.remove(record)
        removed.append(record.reference)
        sweep(cache, records)
    after = usage(cache)
    return PruneResult(tuple(removed), max(0, before - after), after)


def sweep(cache: Cache, records: list[ImageRecord]) -> None:
    """Delete what no record names: layers (unless held) and their lock files, blobs, blob lock
    files, and everything in ``tmp/`` (the caller holds the cache lock exclusively)."""
    layers_used = {d.split(":", 1)[1] for r in records for d in r.diff_ids}
    blobs_used = {d.split(":", 1)[1] for r in records for d in (r.digest, r.config_digest)}
    for path in (cache.root / "layers" / "sha256").iterdir():
        name = path.name.removesuffix(".json")
        if name in layers_used:
            continue
        lock = cache.lock_path(f"layer-{name}")
        with try_locked(lock) as free:
            if free:
                _delete(path)
                if path.suffix != ".json":
                    lock.unlink(missing_ok=True)
    for path in (cache.root / "blobs" / "sha256").iterdir():
        if path.name not in blobs_used:
            _delete(path)
    for path in (cache.root / "locks").glob("blob-*"):
        path.unlink(missing_ok=True)  # no pull runs now: nobody waits on a blob lock
    for path in (cache.root / "tmp").iterdir():
        _delete(path)


def _delete(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        if path.is_dir() and not path.is_symlink():
            remove_tree(path)
        else:
            path.unlink()
