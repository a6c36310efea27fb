"""Holding an image's layers while something runs on them."""

from __future__ import annotations

import os
from types import TracebackType

from .._errors import ImagePullError
from ._cache import Cache
from ._image import Image
from ._locks import hold_shared

__all__ = ["ImageLease", "take_lease"]


class ImageLease:
    """An image whose layers no prune or remove takes away, in any process, until :meth:`release`.

    Use it as ``async with`` or call :meth:`release` (idempotent; a process that dies releases
    its leases with its descriptors). ``image`` is the leased image.
    """

    def __init__(self, image: Image, fds: list[int]) -> None:
        self.image = image
        self._fds = fds

    @property
    def released(self) -> bool:
        """Whether :meth:`release` was called."""
        return self._fds == [-1]

    def release(self) -> None:
        """Let the layers go (a later prune may remove them). Never raises."""
        fds, self._fds = self._fds, [-1]
        for fd in fds:
            if fd >= 0:
                os.close(fd)

    async def __aenter__(self) -> Image:
        return self.image

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


async def take_lease(cache: Cache, image: Image) -> ImageLease:
    """Shared flocks on each of ``image``'s layer locks; ``ImagePullError`` (the caller's: pull
    again) if a layer has left the cache already."""
    fds: list[int] = []
    try:
        for layer in image.layers:
            fds.append(await hold_shared(cache.lock_path(f"layer-{layer.name}")))
        gone = [str(p) for p in image.layers if not p.is_dir()]
        if gone:
            raise ImagePullError(
                f"{image.reference}: layers left the cache: {gone}", reference=image.reference, infrastructure=False
            )
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return ImageLease(image, fds)
