"""The image layer's functions: pull, acquire, look up, hold, list, remove, prune.

Every function takes an optional :class:`ImageOptions` (default: ``ImageOptions.from_env()``).
The cache is shared by every process of the user: a pull holds the cache's lock shared, a
removal or prune holds it exclusively (a collection never takes a layer from under a pull that
is about to record it), and an :class:`ImageLease` keeps an image's layers from any collection.
"""

from __future__ import annotations

import anyio

from .._errors import ImagePullError
from ._cache import Cache
from ._collect import listing, prune_locked, remove_locked, sweep
from ._credentials import default_auth_files
from ._image import CachedImage, Image, PruneResult, image_from_record
from ._lease import ImageLease, take_lease
from ._locks import locked, try_locked
from ._options import ImageOptions
from ._progress import ProgressCallback
from ._reference import Reference, parse_reference

__all__ = ["acquire", "cached", "hold", "list_images", "prune", "pull", "remove"]


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
    process or others, download each layer once. To run something on the image, prefer
    :func:`acquire`: a prune between ``pull`` returning and a :func:`hold` could take its layers.

    Raises ``ImageReferenceError`` for a malformed reference; ``ImagePullError`` otherwise:
    ``infrastructure=False`` for a missing image or tag, refused credentials, no manifest for
    the platform, a layer the unpacker refuses; ``True`` for a digest mismatch, a registry that
    answers 5xx or not at all (after the retries), ``pull_timeout_seconds`` passed, a cache that
    cannot be written. Nothing half-pulled is used; what a failed pull left (layers it finished,
    temporary files) is removed at once when no other pull runs, else by the next prune.
    """
    lease = await _pull(reference, options, on_progress, hold=False)
    return lease.image


async def acquire(
    reference: str | Reference,
    options: ImageOptions | None = None,
    *,
    on_progress: ProgressCallback | None = None,
) -> ImageLease:
    """:func:`pull`, and hold the image's layers before any prune can run: the call for a sandbox
    that runs on the image. Release the lease when the sandbox is gone. Raises as ``pull``."""
    return await _pull(reference, options, on_progress, hold=True)


async def _pull(
    reference: str | Reference, options: ImageOptions | None, on_progress: ProgressCallback | None, *, hold: bool
) -> ImageLease:
    ref = _ref(reference)
    opts, cache = _setup(options)
    try:
        with anyio.fail_after(opts.pull_timeout_seconds):
            async with locked(cache.lock_path("cache"), shared=True):
                image = await _pull_locked(ref, opts, cache, on_progress)
                lease = await take_lease(cache, image) if hold else ImageLease(image, [])
    except TimeoutError as exc:
        await _clean_after_failure(cache)
        raise ImagePullError(
            f"pulling {ref} did not finish within {opts.pull_timeout_seconds} s", reference=str(ref)
        ) from exc
    except ImagePullError as exc:
        await _clean_after_failure(cache)
        if exc.reference is None:
            exc.reference = str(ref)
        raise
    if opts.max_cache_bytes is not None:
        await _collect(cache, opts.max_cache_bytes, keep=image.digest)
    return lease


async def _pull_locked(ref: Reference, opts: ImageOptions, cache: Cache, on_progress: ProgressCallback | None) -> Image:
    if opts.pull_policy == "missing":
        record = cache.find_record(str(ref), opts.platform)
        if record is not None and cache.complete(record):
            cache.touch(record)
            return image_from_record(cache, record)
    # The network side is imported on the first pull that needs it: looking up the cache (a
    # backend's ``cached()`` on every create) imports no aiohttp.
    import aiohttp

    from ._auth import Authenticator
    from ._pull import Puller
    from ._registry import RegistryClient

    files = opts.auth_files if opts.auth_files is not None else default_auth_files()
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        client = RegistryClient(session, opts, Authenticator(session, opts, files))
        return await Puller(client, cache, opts, ref, on_progress).run()


async def _clean_after_failure(cache: Cache) -> None:
    """Sweep what no record names, if no other pull is running right now (else the next prune will)."""
    with anyio.CancelScope(shield=True), try_locked(cache.lock_path("cache")) as free:
        if free:
            await anyio.to_thread.run_sync(lambda: sweep(cache, cache.records()))


def cached(reference: str | Reference, options: ImageOptions | None = None) -> Image | None:
    """The image cached under ``reference`` for ``options.platform``, or None; no network."""
    ref = _ref(reference)
    opts, cache = _setup(options)
    record = cache.find_record(str(ref), opts.platform)
    if record is None or not cache.complete(record):
        return None
    cache.touch(record)
    return image_from_record(cache, record)


async def hold(image: Image, options: ImageOptions | None = None) -> ImageLease:
    """Keep ``image``'s layers in the cache until the lease is released (``async with`` it, or
    ``release()``): prune and remove leave them alone, whichever process asks. Raises
    ``ImagePullError`` if a layer is gone already (pull again)."""
    _opts, cache = _setup(options)
    return await take_lease(cache, image)


def list_images(options: ImageOptions | None = None) -> list[CachedImage]:
    """The images in the cache, least recently used first."""
    _opts, cache = _setup(options)
    return listing(cache)


async def remove(reference: str | Reference, options: ImageOptions | None = None) -> bool:
    """Remove ``reference`` (every platform) from the cache, and the layers no other image uses
    (a held layer stays until it is released and a prune runs). True if it was there. Waits for
    running pulls to finish."""
    ref = _ref(reference)
    _opts, cache = _setup(options)
    async with locked(cache.lock_path("cache")):
        return await anyio.to_thread.run_sync(remove_locked, cache, str(ref))


async def prune(max_bytes: int = 0, options: ImageOptions | None = None) -> PruneResult:
    """Remove least-recently-used images until the cache holds at most ``max_bytes``
    (``0``: every image not held), then every layer, blob and temporary file nothing uses.
    Waits for running pulls to finish."""
    _opts, cache = _setup(options)
    return await _collect(cache, max_bytes, keep=None)


async def _collect(cache: Cache, max_bytes: int, keep: str | None) -> PruneResult:
    async with locked(cache.lock_path("cache")):
        return await anyio.to_thread.run_sync(prune_locked, cache, max_bytes, keep)
