"""One pull: resolve the reference to a manifest, fetch the config, download and unpack the
layers that are not cached yet (in parallel, each once across processes), record the image.

Layers are keyed by their ``diff_id``: a layer another image already brought is not fetched
again. Each layer is made under its ``flock`` (and an in-process lock in front of it): the first
process downloads the blob (digest checked), unpacks it into ``tmp/`` (``diff_id`` checked) and
renames it into place; the others wait, then find it there.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import anyio
import anyio.from_thread

from .._errors import ImagePullError
from ._cache import Cache, ImageRecord
from ._image import Image, image_from_record
from ._locks import locked
from ._manifest import (
    INDEX_TYPES,
    MANIFEST_TYPES,
    Descriptor,
    parse_config,
    parse_index,
    parse_manifest,
    select_platform,
)
from ._options import ImageOptions
from ._progress import ProgressCallback, PullProgress
from ._reference import Reference
from ._registry import Endpoint, RegistryClient, endpoints_for
from ._safefs import remove_tree
from ._unpack import UnpackLimits, unpack_layer

__all__ = ["Puller"]

_MAX_INDEX_DEPTH = 2
#: An image config is a small JSON document; a bigger one is refused before it is fetched.
MAX_CONFIG_BYTES = 8 * 2**20


def _leaves(group: BaseExceptionGroup[ImagePullError]) -> list[ImagePullError]:
    found: list[ImagePullError] = []
    for exc in group.exceptions:
        found.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return found


@dataclass
class _Counts:
    downloaded: int = 0
    download_total: int = 0
    ready: int = 0
    total: int = 0


class Puller:
    """Pulls one reference into ``cache`` through ``client`` (see the module doc)."""

    def __init__(
        self,
        client: RegistryClient,
        cache: Cache,
        options: ImageOptions,
        reference: Reference,
        on_progress: ProgressCallback | None,
    ) -> None:
        self._client = client
        self._cache = cache
        self._options = options
        self._reference = reference
        self._on_progress = on_progress
        self._counts = _Counts()

    def _report(self, event: Literal["download", "layer", "done"]) -> None:
        if self._on_progress is not None:
            c = self._counts
            self._on_progress(
                PullProgress(str(self._reference), event, c.downloaded, c.download_total, c.ready, c.total)
            )

    async def _resolve(self) -> tuple[Endpoint, bytes, str]:
        """The first endpoint (mirrors first) that has the manifest: (endpoint, body, media type)."""
        failures: list[str] = []
        endpoints = endpoints_for(self._reference, self._options)
        for i, endpoint in enumerate(endpoints):
            try:
                body, media_type, _ = await self._client.manifest(endpoint, self._reference, self._reference.selector)
            except ImagePullError as exc:
                if i == len(endpoints) - 1:
                    if failures:
                        exc.message = f"{exc.message} (mirrors: {'; '.join(failures)})"
                        exc.args = (exc.message,)
                    raise
                failures.append(f"{endpoint.host}: {exc.message}")
                continue
            return endpoint, body, media_type
        raise AssertionError("unreachable: there is always the registry itself")  # pragma: no cover

    async def run(self) -> Image:
        endpoint, body, media_type = await self._resolve()
        digest = None
        for _ in range(_MAX_INDEX_DEPTH + 1):
            if media_type not in INDEX_TYPES:
                break
            chosen = select_platform(parse_index(body), self._options.platform)
            body, media_type, digest = await self._client.manifest(endpoint, self._reference, chosen.digest)
        if media_type not in MANIFEST_TYPES:
            raise ImagePullError(
                f"{self._reference}: unsupported manifest type {media_type!r}",
                reference=str(self._reference),
                infrastructure=False,
            )
        manifest = parse_manifest(body)
        if digest is None:
            digest = "sha256:" + hashlib.sha256(body).hexdigest()
        if manifest.config.size > MAX_CONFIG_BYTES:
            raise ImagePullError(
                f"{self._reference}: the image config announces {manifest.config.size} bytes"
                f" (more than {MAX_CONFIG_BYTES})",
                reference=str(self._reference),
                infrastructure=False,
            )
        await self._blob(endpoint, manifest.config, None)
        config = parse_config(self._cache.blob_path(manifest.config.digest).read_bytes())
        if len(config.diff_ids) != len(manifest.layers):
            raise ImagePullError(
                f"{self._reference}: the manifest names {len(manifest.layers)} layers, the config"
                f" {len(config.diff_ids)} diff_ids",
                reference=str(self._reference),
                infrastructure=False,
            )
        pairs = list(zip(manifest.layers, config.diff_ids, strict=True))
        missing = [(d, i) for d, i in pairs if not self._cache.layer_path(i).is_dir()]
        self._counts = _Counts(
            download_total=sum(d.size for d, _ in missing), ready=len(pairs) - len(missing), total=len(pairs)
        )
        limiter = anyio.CapacityLimiter(max(1, self._options.max_concurrent_downloads))
        try:
            async with anyio.create_task_group() as tg:
                for descriptor, diff_id in missing:
                    tg.start_soon(self._layer, endpoint, descriptor, diff_id, limiter)
        except BaseExceptionGroup as group:
            # The first layer's failure ends the pull (the others were cancelled): raise it as
            # itself, unless something else (a bug) is in the group too.
            errors, rest = group.split(ImagePullError)
            if errors is None or rest is not None:
                raise
            first = _leaves(errors)[0]
            raise first from first.__cause__
        self._cache.write_atomic(self._cache.blob_path(digest), body)
        size = sum(self._cache.layer_size(i) for i in config.diff_ids)
        record = ImageRecord(
            str(self._reference), self._options.platform, digest, manifest.config.digest, config.diff_ids, size, 0.0
        )
        self._cache.write_record(record)
        self._report("done")
        return image_from_record(self._cache, record)

    async def _blob(self, endpoint: Endpoint, descriptor: Descriptor, on_bytes: Callable[[int], None] | None) -> None:
        path = self._cache.blob_path(descriptor.digest)
        if path.is_file():
            return
        async with locked(self._cache.blob_lock(descriptor.digest)):
            if not path.is_file():
                await self._client.blob(
                    endpoint, self._reference, descriptor.digest, path, on_bytes, max_bytes=descriptor.size
                )

    def _count(self, n: int) -> None:
        self._counts.downloaded += n
        self._report("download")

    async def _layer(
        self, endpoint: Endpoint, descriptor: Descriptor, diff_id: str, limiter: anyio.CapacityLimiter
    ) -> None:
        final = self._cache.layer_path(diff_id)
        async with limiter, locked(self._cache.layer_lock(diff_id)):
            if not final.is_dir():
                await self._blob(endpoint, descriptor, self._count)
                await self._unpack(descriptor, diff_id)
            else:
                self._counts.downloaded += descriptor.size
        self._counts.ready += 1
        self._report("layer")

    async def _unpack(self, descriptor: Descriptor, diff_id: str) -> None:
        blob = self._cache.blob_path(descriptor.digest)
        tmp = self._cache.tmp_dir("layer-")
        limits = UnpackLimits(self._options.max_layer_bytes, self._options.max_layer_entries)
        try:
            result = await anyio.to_thread.run_sync(
                unpack_layer, blob, tmp, limits, diff_id, anyio.from_thread.check_cancelled
            )
            meta = {
                "diff_id": diff_id,
                "digest": descriptor.digest,
                "bytes": result.bytes,
                "entries": result.entries,
                "disk_bytes": result.bytes + 512 * result.entries,
                "owners": result.owners,
                "setid_removed": result.setid_removed,
                "devices_skipped": result.devices_skipped,
                "xattrs_dropped": result.xattrs_dropped,
            }
            self._cache.write_atomic(self._cache.layer_meta_path(diff_id), json.dumps(meta).encode())
            os.rename(tmp, self._cache.layer_path(diff_id))
        except BaseException:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(remove_tree, tmp)
            raise
        finally:
            if not self._options.keep_layer_blobs:
                blob.unlink(missing_ok=True)
