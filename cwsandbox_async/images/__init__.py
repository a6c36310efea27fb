"""Container images: pull from a registry, cache, unpack into layers an overlay can mount.

This package knows nothing of sandboxes. ``await pull("python:3.11")`` returns an
:class:`Image` whose ``layers`` (bottom first) and ``config`` (``Env``, ``WorkingDir``,
``User``...) a backend builds a root from; ``await acquire(ref)`` pulls and returns an
:class:`ImageLease` that keeps them in the cache until released.
Settings come from :class:`ImageOptions` or the environment (``CWSANDBOX_IMAGE_CACHE``,
``CWSANDBOX_INSECURE_REGISTRIES``, ``CWSANDBOX_REGISTRY_MIRRORS``,
``CWSANDBOX_IMAGE_CACHE_MAX_BYTES``). Errors are ``cwsandbox_async.ImagePullError``, and
``ImageReferenceError`` (a ``SandboxValidationError``) for a malformed reference.
"""

from ._api import acquire, cached, hold, list_images, prune, pull, remove
from ._image import CachedImage, Image, PruneResult
from ._lease import ImageLease
from ._manifest import ImageConfig
from ._options import ImageOptions, Platform, host_platform
from ._progress import ProgressCallback, PullProgress, tqdm_progress
from ._reference import ImageReferenceError, Reference, parse_reference
from ._unpack import OPAQUE_XATTR

__all__ = [
    "OPAQUE_XATTR",
    "CachedImage",
    "Image",
    "ImageConfig",
    "ImageLease",
    "ImageOptions",
    "ImageReferenceError",
    "Platform",
    "ProgressCallback",
    "PruneResult",
    "PullProgress",
    "Reference",
    "acquire",
    "cached",
    "hold",
    "host_platform",
    "list_images",
    "parse_reference",
    "prune",
    "pull",
    "remove",
    "tqdm_progress",
]
