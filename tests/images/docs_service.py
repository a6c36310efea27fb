"""A registry for the docs blocks that pull images (``<!-- docs-test: services=registry -->``).

It serves ``library/busybox:latest`` (and ``:1.36``) on loopback and is set as the ``docker.io``
mirror, so a block pulls ``busybox`` exactly as a user writes it, with no network.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from images.build import busybox_layer, make_image
from images.push import Pusher
from images.servers import REGISTRY_BINARY, Registry

__all__ = ["REGISTRY_BINARY", "docs_registry"]

BUSYBOX_CONFIG = {"Env": ["PATH=/bin", "GREETING=hello"], "WorkingDir": "/tmp", "Cmd": ["sh"]}


@contextlib.contextmanager
def docs_registry(root: Path) -> Iterator[dict[str, str]]:
    """Start the registry under ``root``, push busybox, yield the environment a block runs with.

    Needs ``docker-registry`` (``REGISTRY_BINARY`` is None without it: skip the block)."""
    server = Registry(root / "registry")
    try:
        spec = make_image([busybox_layer()], config=BUSYBOX_CONFIG)
        pusher = Pusher(server.host)
        for tag in ("latest", "1.36"):
            pusher.image("library/busybox", tag, spec)
        yield {
            "CWSANDBOX_REGISTRY_MIRRORS": f"docker.io={server.host}",
            "CWSANDBOX_IMAGE_CACHE": str(root / "image-cache"),
        }
    finally:
        server.stop()
