"""Test images, built offline: layers as tars made with ``tarfile``, configs, manifests, indexes.

An :class:`ImageSpec` is the blobs of one image and its manifest; ``push.push_image`` sends it
to a registry through the HTTP API. Everything is deterministic (fixed mtimes), so the same
spec has the same digests every run.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
MTIME = 1_700_000_000


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass
class Entry:
    """One tar member: ``kind`` is file, dir, symlink, hardlink, chardev, fifo."""

    name: str
    kind: str = "file"
    data: bytes = b""
    mode: int = 0o644
    link: str = ""
    uid: int = 0
    gid: int = 0
    xattrs: dict[str, str] = field(default_factory=dict)


def tar_bytes(entries: list[Entry]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for e in entries:
            info = tarfile.TarInfo(e.name)
            info.mtime, info.mode, info.uid, info.gid = MTIME, e.mode, e.uid, e.gid
            info.pax_headers = {f"SCHILY.xattr.{k}": v for k, v in e.xattrs.items()}
            if e.kind == "file":
                info.size = len(e.data)
                tar.addfile(info, io.BytesIO(e.data))
                continue
            info.type = {
                "dir": tarfile.DIRTYPE,
                "symlink": tarfile.SYMTYPE,
                "hardlink": tarfile.LNKTYPE,
                "chardev": tarfile.CHRTYPE,
                "fifo": tarfile.FIFOTYPE,
            }[e.kind]
            info.linkname = e.link
            if e.kind == "chardev":
                info.devmajor, info.devminor = 1, 3
            tar.addfile(info)
    return out.getvalue()


def compress(data: bytes, how: str) -> bytes:
    if how == "gzip":
        return gzip.compress(data, mtime=0)
    if how == "zstd":
        from backports import zstd  # the zstd extra; tests that need it skip without it

        return bytes(zstd.compress(data))
    return data


LAYER_TYPES = {
    "gzip": "application/vnd.oci.image.layer.v1.tar+gzip",
    "zstd": "application/vnd.oci.image.layer.v1.tar+zstd",
    "none": "application/vnd.oci.image.layer.v1.tar",
}


@dataclass
class ImageSpec:
    """An image's blobs (digest -> bytes), its manifest and the manifest's media type."""

    blobs: dict[str, bytes]
    manifest: bytes
    media_type: str
    layer_digests: list[str]
    diff_ids: list[str]

    @property
    def digest(self) -> str:
        return sha256(self.manifest)


def make_image(
    layers: list[list[Entry]],
    *,
    compression: str | list[str] = "gzip",
    arch: str = "amd64",
    variant: str | None = None,
    config: dict[str, object] | None = None,
    docker: bool = False,
) -> ImageSpec:
    blobs: dict[str, bytes] = {}
    layer_descs, diff_ids = [], []
    for i, entries in enumerate(layers):
        how = compression[i] if isinstance(compression, list) else compression
        raw = tar_bytes(entries)
        blob = compress(raw, how)
        blobs[sha256(blob)] = blob
        diff_ids.append(sha256(raw))
        media = "application/vnd.docker.image.rootfs.diff.tar.gzip" if docker else LAYER_TYPES[how]
        layer_descs.append({"mediaType": media, "digest": sha256(blob), "size": len(blob)})
    cfg: dict[str, object] = {
        "architecture": arch,
        "os": "linux",
        "config": config or {},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }
    if variant:
        cfg["variant"] = variant
    cfg_bytes = json.dumps(cfg, sort_keys=True).encode()
    blobs[sha256(cfg_bytes)] = cfg_bytes
    media_type = DOCKER_MANIFEST if docker else OCI_MANIFEST
    manifest = {
        "schemaVersion": 2,
        "mediaType": media_type,
        "config": {
            "mediaType": DOCKER_CONFIG if docker else OCI_CONFIG,
            "digest": sha256(cfg_bytes),
            "size": len(cfg_bytes),
        },
        "layers": layer_descs,
    }
    return ImageSpec(blobs, json.dumps(manifest).encode(), media_type, [d["digest"] for d in layer_descs], diff_ids)


def make_index(images: list[tuple[ImageSpec, str, str | None]], *, docker: bool = False) -> bytes:
    """An OCI index (or Docker manifest list) over ``(image, arch, variant)``."""
    manifests = []
    for spec, arch, variant in images:
        platform = {"os": "linux", "architecture": arch}
        if variant:
            platform["variant"] = variant
        manifests.append(
            {"mediaType": spec.media_type, "digest": spec.digest, "size": len(spec.manifest), "platform": platform}
        )
    media = DOCKER_LIST if docker else OCI_INDEX
    return json.dumps({"schemaVersion": 2, "mediaType": media, "manifests": manifests}).encode()


def busybox_layer() -> list[Entry]:
    """busybox-static's binary with its applet links: a real, runnable image root."""
    found = shutil.which("busybox")
    binary = Path(found).read_bytes() if found else b"#!/bin/false\n"
    entries = [Entry("bin", "dir", mode=0o755), Entry("bin/busybox", data=binary, mode=0o755)]
    entries += [Entry(f"bin/{a}", "symlink", link="busybox") for a in ("sh", "ls", "cat", "echo", "id")]
    entries += [Entry("etc", "dir"), Entry("etc/passwd", data=b"root:x:0:0:root:/root:/bin/sh\n")]
    entries += [Entry("tmp", "dir", mode=0o1777)]
    return entries
