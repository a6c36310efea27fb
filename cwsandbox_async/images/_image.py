"""The public result types of the image layer."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ._cache import Cache, ImageRecord
from ._manifest import ImageConfig, parse_config
from ._options import Platform

__all__ = ["CachedImage", "Image", "PruneResult", "image_from_record"]


@dataclass(frozen=True)
class Image:
    """A pulled image, ready in the cache.

    ``layers`` are the unpacked layer directories, **bottom first**, as the manifest lists them;
    :attr:`lowerdirs` is what overlayfs's ``lowerdir`` takes. They are shared with other images
    and must be mounted read-only. ``config`` carries ``Env``, ``WorkingDir``, ``User``,
    ``Entrypoint`` and ``Cmd``. ``digest`` is the manifest's digest (the platform's manifest, when
    the reference named an index).
    """

    reference: str
    digest: str
    config_digest: str
    platform: Platform
    config: ImageConfig
    layers: tuple[Path, ...]
    size_bytes: int

    @property
    def lowerdirs(self) -> tuple[Path, ...]:
        """The layers as overlayfs's ``lowerdir`` takes them: top first, each once.

        An image may repeat a layer (the empty layer of metadata-only build steps, say). Only the
        topmost occurrence is kept: the repeat on top lays the same entries again, so the view is
        the same, and overlayfs refuses a directory given twice."""
        seen: set[Path] = set()
        result: list[Path] = []
        for layer in reversed(self.layers):
            if layer not in seen:
                seen.add(layer)
                result.append(layer)
        return tuple(result)

    @property
    def pinned_reference(self) -> str:
        """``registry/repository@digest``: the same image, wherever its tag moves."""
        name = self.reference.split("@", 1)[0]
        slash = name.rfind("/")
        colon = name.rfind(":")
        if colon > slash:
            name = name[:colon]
        return f"{name}@{self.digest}"


@dataclass(frozen=True)
class CachedImage:
    """One image in the cache, as :func:`list_images` reports it (``last_used``: POSIX time)."""

    reference: str
    digest: str
    platform: Platform
    size_bytes: int
    last_used: float


@dataclass(frozen=True)
class PruneResult:
    """What a prune removed: the images (references), and the bytes freed and left."""

    removed: tuple[str, ...]
    freed_bytes: int
    remaining_bytes: int


def image_from_record(cache: Cache, record: ImageRecord) -> Image:
    """The :class:`Image` a complete record describes (its config read from the blob store)."""
    config = parse_config(cache.blob_path(record.config_digest).read_bytes())
    return Image(
        reference=record.reference,
        digest=record.digest,
        config_digest=record.config_digest,
        platform=record.platform,
        config=config,
        layers=tuple(cache.layer_path(d) for d in record.diff_ids),
        size_bytes=record.size_bytes,
    )
