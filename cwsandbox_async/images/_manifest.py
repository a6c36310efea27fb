"""Manifests, indexes and image configs: parsing, and choosing a platform from an index.

OCI image indexes and Docker manifest lists name one manifest per platform; OCI and Docker
image manifests name a config blob and the layer blobs, bottom first. Docker's schema 1 is not
supported (registries converted away from it years ago). Every refusal here is the image's,
``ImagePullError(infrastructure=False)``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .._errors import ImagePullError
from ._options import Platform

__all__ = [
    "ACCEPT",
    "Descriptor",
    "ImageConfig",
    "Manifest",
    "parse_config",
    "parse_index",
    "parse_manifest",
    "select_platform",
]

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
INDEX_TYPES = frozenset({OCI_INDEX, DOCKER_LIST})
MANIFEST_TYPES = frozenset({OCI_MANIFEST, DOCKER_MANIFEST})
#: What a manifest request accepts, preferred first.
ACCEPT = ", ".join((OCI_INDEX, DOCKER_LIST, OCI_MANIFEST, DOCKER_MANIFEST))


@dataclass(frozen=True)
class Descriptor:
    """A blob a manifest names: its media type, digest and size, and the platform in an index."""

    media_type: str
    digest: str
    size: int
    platform: Platform | None = None


@dataclass(frozen=True)
class Manifest:
    """An image manifest: the config blob and the layer blobs, bottom first."""

    config: Descriptor
    layers: tuple[Descriptor, ...]


@dataclass(frozen=True)
class ImageConfig:
    """What an image's config says about how to run it (``config`` of the OCI image config).

    ``env`` as ``NAME=value`` strings in the image's order; ``working_dir`` and ``user`` empty
    when the image names none; ``diff_ids`` are the digests of the uncompressed layers.
    """

    env: tuple[str, ...] = ()
    working_dir: str = ""
    user: str = ""
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    labels: dict[str, str] = field(default_factory=dict, hash=False)
    stop_signal: str = ""
    diff_ids: tuple[str, ...] = ()
    platform: Platform = field(default_factory=Platform)

    def environment(self) -> dict[str, str]:
        """``env`` as a mapping (a later duplicate wins, as in Docker)."""
        result: dict[str, str] = {}
        for item in self.env:
            name, _, value = item.partition("=")
            result[name] = value
        return result


def _bad(what: str) -> ImagePullError:
    return ImagePullError(what, infrastructure=False)


def _json(data: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError as exc:
        raise _bad(f"the {what} is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise _bad(f"the {what} is not a JSON object")
    return value


def _descriptor(raw: object, what: str) -> Descriptor:
    if not isinstance(raw, dict):
        raise _bad(f"a {what} descriptor is not an object")
    media_type, digest, size = raw.get("mediaType"), raw.get("digest"), raw.get("size")
    if not isinstance(digest, str) or not digest.startswith("sha256:") or len(digest) != 71:
        raise _bad(f"a {what} descriptor has no sha256 digest: {digest!r}")
    if not isinstance(size, int) or size < 0:
        raise _bad(f"a {what} descriptor has no size")
    platform = raw.get("platform")
    parsed = None
    if isinstance(platform, dict):
        parsed = Platform(str(platform.get("os", "")), str(platform.get("architecture", "")), platform.get("variant"))
    return Descriptor(str(media_type or ""), digest, size, parsed)


def media_type_of(data: bytes, content_type: str | None) -> str:
    """The manifest's media type: its own ``mediaType`` field, else the response's Content-Type."""
    try:
        own = json.loads(data).get("mediaType")
    except (ValueError, AttributeError):
        own = None
    if isinstance(own, str) and own:
        return own
    return (content_type or "").split(";")[0].strip()


def parse_index(data: bytes) -> tuple[Descriptor, ...]:
    """The manifests an OCI index or Docker manifest list names."""
    raw = _json(data, "image index").get("manifests")
    if not isinstance(raw, list):
        raise _bad("the image index has no 'manifests' list")
    return tuple(_descriptor(item, "manifest") for item in raw)


def parse_manifest(data: bytes) -> Manifest:
    """The config and layers of an OCI or Docker image manifest."""
    raw = _json(data, "image manifest")
    if raw.get("schemaVersion") == 1:
        raise _bad("Docker schema 1 manifests are not supported; push the image again with a current tool")
    layers = raw.get("layers")
    if not isinstance(layers, list):
        raise _bad("the image manifest has no 'layers' list")
    return Manifest(_descriptor(raw.get("config"), "config"), tuple(_descriptor(item, "layer") for item in layers))


def select_platform(manifests: tuple[Descriptor, ...], wanted: Platform) -> Descriptor:
    """The manifest for ``wanted``: same os and architecture; the same variant, else one without a
    variant, else (when no variant is asked) the first. Raises ``ImagePullError`` (the caller's)
    naming the platforms there are."""
    same = [
        d
        for d in manifests
        if d.platform is not None and d.platform.os == wanted.os and d.platform.architecture == wanted.architecture
    ]
    for choose in (
        lambda d: d.platform.variant == wanted.variant,
        lambda d: d.platform.variant in (None, ""),
        lambda d: wanted.variant is None,
    ):
        for descriptor in same:
            if choose(descriptor):
                return descriptor
    there = ", ".join(sorted({str(d.platform) for d in manifests if d.platform is not None})) or "none named"
    raise _bad(f"the image has no manifest for {wanted} (it has: {there})")


def _strings(value: object) -> tuple[str, ...]:
    if isinstance(value, list):
        return tuple(str(v) for v in value)
    if isinstance(value, str):
        return (value,)
    return ()


def parse_config(data: bytes) -> ImageConfig:
    """The image config blob -> :class:`ImageConfig`."""
    raw = _json(data, "image config")
    config = raw.get("config") or {}
    rootfs = raw.get("rootfs") or {}
    if not isinstance(config, dict) or not isinstance(rootfs, dict):
        raise _bad("the image config's 'config' or 'rootfs' is not an object")
    diff_ids = _strings(rootfs.get("diff_ids"))
    if any(not d.startswith("sha256:") or len(d) != 71 for d in diff_ids):
        raise _bad("the image config's rootfs.diff_ids are not sha256 digests")
    labels = config.get("Labels") or {}
    return ImageConfig(
        env=_strings(config.get("Env")),
        working_dir=str(config.get("WorkingDir") or ""),
        user=str(config.get("User") or ""),
        entrypoint=_strings(config.get("Entrypoint")),
        cmd=_strings(config.get("Cmd")),
        labels={str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {},
        stop_signal=str(config.get("StopSignal") or ""),
        diff_ids=diff_ids,
        platform=Platform(str(raw.get("os") or ""), str(raw.get("architecture") or ""), raw.get("variant")),
    )
