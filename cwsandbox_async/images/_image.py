"""The public result types of the image layer."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ._manifest import ImageConfig
from ._options import Platform

__all__ = ["CachedImage", "Image", "PruneResult"]


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
