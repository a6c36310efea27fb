"""The image layer's functions: pull, look up, hold, list, remove, prune.

Every function takes an optional :class:`ImageOptions` (default: ``ImageOptions.from_env()``).
The cache is shared by every process of the user: a pull holds the cache's lock shared, a
removal or prune holds it exclusively (so a collection never takes a layer from under a pull
that is about to record it), and an image :func:`hold` keeps its layers from any collection.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import anyio

from .._errors import ImagePullError
from ._auth import Authenticator
from ._cache import Cache, ImageRecord
from ._credentials import default_auth_files
from ._image import CachedImage, Image, PruneResult
from ._locks import hold_shared, locked, try_locked
from ._options import ImageOptions
from ._progress import ProgressCallback
from ._pull import Puller, image_from_record
from ._reference import Reference, parse_reference
from ._registry import RegistryClient
from ._safefs import remove_tree

__all__ = ["cached", "hold", "list_images", "prune", "pull", "remove"]


def _setup(options: ImageOptions | None) -> tuple[ImageOptions, Cache]:
    opts = options if options is not None else ImageOptions.from_env()
    cache = Cache(opts.cache_dir)
    try:
        cache.ensure()
    except OSError as exc:
        raise ImagePullError(f"cannot create the image cache at {opts.cache_dir}: {exc}", infrastructure=True) from exc
    return opts, cache


def _ref(reference: str | Reference) -> Reference:
    return reference if isinstance(reference, Reference) else parse_reference(reference)


async def pull(
    reference: str | Reference,
    options: ImageOptions | None = None,
    *,
    on_progress: ProgressCallback | None = None,
) -> Image:
    """Pull ``reference`` for ``options.platform`` into the cache and return it.

    With ``pull_policy="missing"`` (the default) an image already cached under this reference is
    returned without asking the registry; ``"always"`` asks the registry for the manifest each
    time (layers already cached are not fetched again). Concurrent pulls of one image, in this
    process or others, download each layer once.

    Raises ``ImageReferenceError`` for a malformed reference; ``ImagePullError`` otherwise:
    ``infrastructure=False`` for a missing image or tag, refused credentials, no manifest for
    the platform, a layer the unpacker refuses; ``True`` for a digest mismatch, a registry that
    answers 5xx or not at all (after the retries), ``pull_timeout_seconds`` passed. Nothing
    half-pulled is left in the cache.
    """
    ref = _ref(reference)
    opts, cache = _setup(options)
    try:
        with anyio.fail_after(opts.pull_timeout_seconds):
            async with locked(cache.lock_path("cache"), shared=True):
                image = await _pull_locked(ref, opts, cache, on_progress)
    except TimeoutError as exc:
        raise ImagePullError(
            f"pulling {ref} did not finish within {opts.pull_timeout_seconds} s", reference=str(ref)
        ) from exc
    if opts.max_cache_bytes is not None:
        await _collect(cache, opts.max_cache_bytes, keep=image.digest)
    return image


async def _pull_locked(ref: Reference, opts: ImageOptions, cache: Cache, on_progress: ProgressCallback | None) -> Image:
    if opts.pull_policy == "missing":
        record = cache.find_record(str(ref), opts.platform)
        if record is not None and cache.complete(record):
            cache.touch(record)
            return image_from_record(cache, record)
    files = opts.auth_files if opts.auth_files is not None else default_auth_files()
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        client = RegistryClient(session, opts, Authenticator(session, opts, files))
        return await Puller(client, cache, opts, ref, on_progress).run()


def cached(reference: str | Reference, options: ImageOptions | None = None) -> Image | None:
    """The image cached under ``reference`` for ``options.platform``, or None; no network."""
    ref = _ref(reference)
    opts, cache = _setup(options)
    record = cache.find_record(str(ref), opts.platform)
    if record is None or not cache.complete(record):
        return None
    cache.touch(record)
    return image_from_record(cache, record)


@contextlib.asynccontextmanager
async def hold(image: Image, options: ImageOptions | None = None) -> AsyncIterator[Image]:
    """Keep ``image``'s layers in the cache for the block (a sandbox running on them): prune and
    remove leave them alone, whichever process asks. Raises ``ImagePullError`` if a layer is
    gone already (pull again)."""
    _opts, cache = _setup(options)
    fds: list[int] = []
    try:
        for layer in image.layers:
            fds.append(await hold_shared(cache.lock_path(f"layer-{layer.name}")))
        gone = [str(p) for p in image.layers if not p.is_dir()]
        if gone:
            raise ImagePullError(f"{image.reference}: layers left the cache: {gone}", infrastructure=False)
        yield image
    finally:
        for fd in fds:
            os.close(fd)


def list_images(options: ImageOptions | None = None) -> list[CachedImage]:
    """The images in the cache, least recently used first."""
    _opts, cache = _setup(options)
    return [
        CachedImage(r.reference, r.digest, r.platform, r.size_bytes, r.last_used)
        for r in cache.records()
        if cache.complete(r)
    ]


async def remove(reference: str | Reference, options: ImageOptions | None = None) -> bool:
    """Remove ``reference`` (every platform) from the cache, and the layers no other image uses
    (a held layer stays until it is released and a prune runs). True if it was there."""
    ref = _ref(reference)
    _opts, cache = _setup(options)
    async with locked(cache.lock_path("cache")):
        return await anyio.to_thread.run_sync(_remove_records, cache, str(ref))


def _remove_records(cache: Cache, reference: str) -> bool:
    found = [r for r in cache.records() if r.reference == reference]
    for record in found:
        cache.record_path(record.reference, record.platform).unlink(missing_ok=True)
    _sweep(cache, cache.records())
    return bool(found)


async def prune(max_bytes: int = 0, options: ImageOptions | None = None) -> PruneResult:
    """Remove least-recently-used images until the cache holds at most ``max_bytes``
    (``0``: everything not held), then every layer, blob and temporary file nothing uses."""
    _opts, cache = _setup(options)
    return await _collect(cache, max_bytes, keep=None)


async def _collect(cache: Cache, max_bytes: int, keep: str | None) -> PruneResult:
    async with locked(cache.lock_path("cache")):
        return await anyio.to_thread.run_sync(_prune_locked, cache, max_bytes, keep)


def _held(cache: Cache, record: ImageRecord) -> bool:
    """Whether someone holds the image (all its layers are held: a layer it only shares with a
    held image stays anyway, by the sweep)."""
    for diff_id in record.diff_ids:
        with try_locked(cache.layer_lock(diff_id)) as free:
            if free:
                return False
    return bool(record.diff_ids)


def _usage(cache: Cache) -> int:
    layers = cache.root / "layers" / "sha256"
    total = sum(cache.layer_size("sha256:" + p.name) for p in layers.iterdir() if p.is_dir())
    blobs = cache.root / "blobs" / "sha256"
    return total + sum(p.stat().st_size for p in blobs.iterdir() if p.is_file())


def _prune_locked(cache: Cache, max_bytes: int, keep: str | None) -> PruneResult:
    before = _usage(cache)
    records = cache.records()
    removed: list[str] = []
    _sweep(cache, records)
    for record in list(records):
        if _usage(cache) <= max_bytes:
            break
        if record.digest == keep or _held(cache, record):
            continue
        cache.record_path(record.reference, record.platform).unlink(missing_ok=True)
        records.remove(record)
        removed.append(record.reference)
        _sweep(cache, records)
    after = _usage(cache)
    return PruneResult(tuple(removed), max(0, before - after), after)


def _sweep(cache: Cache, records: list[ImageRecord]) -> None:
    """Delete what no record names: layers (unless held), blobs, and everything in ``tmp/``
    (the caller holds the cache lock exclusively, so no pull is writing there)."""
    layers_used = {d.split(":", 1)[1] for r in records for d in r.diff_ids}
    blobs_used = {d.split(":", 1)[1] for r in records for d in (r.digest, r.config_digest)}
    layers = cache.root / "layers" / "sha256"
    for path in layers.iterdir():
        name = path.name.removesuffix(".json")
        if name in layers_used:
            continue
        with try_locked(cache.lock_path(f"layer-{name}")) as free:
            if free:
                _delete(path)
    for path in (cache.root / "blobs" / "sha256").iterdir():
        if path.name not in blobs_used:
            _delete(path)
    for path in (cache.root / "tmp").iterdir():
        _delete(path)


def _delete(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        remove_tree(path)
    else:
        path.unlink(missing_ok=True)
