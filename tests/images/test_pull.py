"""Pulling from a real registry on loopback: manifests, indexes, zstd, the cache, and the errors."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from cwsandbox_async import ImagePullError
from cwsandbox_async.images import ImageOptions, Platform, PullProgress, cached, list_images, pull, tqdm_progress
from images.conftest import Images
from images.servers import FaultProxy, Registry, free_port


def _tree(root: Path) -> dict[str, str]:
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            out[rel] = "-> " + os.readlink(path)
        elif path.is_file():
            out[rel] = path.read_bytes()[:16].decode("latin-1")
    return out


def _nothing_kept(cache: Path) -> None:
    assert list((cache / "images").iterdir()) == []
    assert list((cache / "layers" / "sha256").iterdir()) == []
    assert list((cache / "tmp").iterdir()) == []
    assert [p for p in (cache / "blobs" / "sha256").iterdir() if p.name.endswith(".part")] == []


async def test_busybox_pull_gives_layers_and_config(registry: Registry, images: Images, options: ImageOptions) -> None:
    seen: list[PullProgress] = []
    image = await pull(f"{registry.host}/test/busybox", options, on_progress=seen.append)
    assert image.reference == f"{registry.host}/test/busybox:latest"
    assert image.digest == images.busybox.digest
    assert image.config.environment() == {"PATH": "/bin", "GREETING": "hello"}
    assert (image.config.working_dir, image.config.user, image.config.cmd) == ("/tmp", "0", ("sh",))
    assert len(image.layers) == 1
    busybox = image.layers[0] / "bin" / "busybox"
    assert busybox.is_file() and os.access(busybox, os.X_OK)
    assert os.readlink(image.layers[0] / "bin" / "sh") == "busybox"
    assert (image.layers[0] / "tmp").stat().st_mode & 0o7777 == 0o1777
    assert image.pinned_reference == f"{registry.host}/test/busybox@{images.busybox.digest}"
    assert seen[-1].event == "done"
    assert seen[-1].downloaded_bytes == seen[-1].download_total_bytes > 0
    assert seen[-1].layers_ready == seen[-1].layers_total == 1
    # The layer blob was unpacked and not kept; the manifest and config are.
    blobs = {p.name for p in (options.cache_dir / "blobs" / "sha256").iterdir()}
    assert images.busybox.layer_digests[0].split(":")[1] not in blobs
    assert images.busybox.digest.split(":")[1] in blobs
    assert [c.digest for c in list_images(options)] == [image.digest]
    assert cached(f"{registry.host}/test/busybox", options) == image


async def test_cached_image_needs_no_registry(registry: Registry, images: Images, options: ImageOptions) -> None:
    ref = f"{registry.host}/test/busybox:latest"
    first = await pull(ref, options)
    offline = dataclasses.replace(options, attempts=1)
    # The same reference through a registry that is not there: "missing" policy answers from the cache.
    moved = ImageOptions(**{**offline.__dict__})
    assert (await pull(ref, moved)).layers == first.layers
    with pytest.raises(ImagePullError) as info:
        await pull(f"127.0.0.1:{free_port()}/test/busybox:latest", offline)
    assert info.value.infrastructure is True


async def test_digest_reference_and_tag_with_digest(registry: Registry, images: Images, options: ImageOptions) -> None:
    digest = images.layered.digest
    by_digest = await pull(f"{registry.host}/test/layered@{digest}", options)
    both = await pull(f"{registry.host}/test/layered:v1@{digest}", options)
    assert by_digest.digest == both.digest == digest
    assert by_digest.layers == both.layers  # layers are shared, not unpacked twice
    wrong = "sha256:" + "0" * 64
    with pytest.raises(ImagePullError) as info:
        await pull(f"{registry.host}/test/layered@{wrong}", options)
    assert info.value.infrastructure is False
    assert "MANIFEST_UNKNOWN" in str(info.value) or "not found" in str(info.value).lower()


@pytest.mark.parametrize(
    ("platform", "arch"),
    [
        (Platform("linux", "amd64"), "amd64"),
        (Platform("linux", "arm64", "v8"), "arm64"),
        (Platform("linux", "arm64"), "arm64"),
    ],
)
async def test_index_platform_selection(
    registry: Registry, images: Images, options: ImageOptions, platform: Platform, arch: str
) -> None:
    opts = dataclasses.replace(options, platform=platform)
    image = await pull(f"{registry.host}/test/multi:v1", opts)
    assert (image.layers[0] / "arch").read_text() == arch
    assert image.config.environment()["ARCH"] == arch
    assert image.digest == (images.amd64 if arch == "amd64" else images.arm64).digest


async def test_index_without_the_platform_is_the_callers(
    registry: Registry, images: Images, options: ImageOptions
) -> None:
    opts = dataclasses.replace(options, platform=Platform("linux", "s390x"))
    with pytest.raises(ImagePullError) as info:
        await pull(f"{registry.host}/test/multi:v1", opts)
    assert info.value.infrastructure is False
    assert "linux/amd64" in str(info.value) and "linux/arm64/v8" in str(info.value)


async def test_zstd_and_gzip_layers(registry: Registry, images: Images, options: ImageOptions) -> None:
    if images.zstd is None:
        pytest.skip("the zstd extra is not installed (pip install 'cwsandbox-async[zstd]')")
    image = await pull(f"{registry.host}/test/zstd:v1", options)
    assert (image.layers[0] / "z").read_bytes() == b"zstd layer " * 1000
    assert (image.layers[1] / "g").read_bytes() == b"gzip layer"


async def test_missing_image_is_the_callers_with_the_registrys_words(registry: Registry, options: ImageOptions) -> None:
    with pytest.raises(ImagePullError) as info:
        await pull(f"{registry.host}/test/nothing:v1", options)
    assert info.value.infrastructure is False
    assert "NAME_UNKNOWN" in str(info.value) or "MANIFEST_UNKNOWN" in str(info.value)
    _nothing_kept(options.cache_dir)


async def test_503_then_200_is_retried_honouring_retry_after(
    proxy: FaultProxy, images: Images, options: ImageOptions
) -> None:
    proxy.fail_next(2, "/manifests/")
    proxy.fail_next(2, "/blobs/")
    image = await pull(f"{proxy.host}/test/busybox:latest", options)
    assert image.digest == images.busybox.digest
    failed = [r for r in proxy.requests if r.startswith("503 ")]
    assert len(failed) == 4
    # each failed request was followed by the same request again
    assert sum(1 for r in proxy.requests if "/manifests/" in r and not r.startswith("503")) >= 1


async def test_5xx_past_the_retries_is_infrastructure(proxy: FaultProxy, options: ImageOptions) -> None:
    proxy.fail_next(100, "/manifests/")
    with pytest.raises(ImagePullError) as info:
        await pull(f"{proxy.host}/test/busybox:latest", options)
    assert info.value.infrastructure is True
    assert "503" in str(info.value) and "UNAVAILABLE" in str(info.value)
    assert len([r for r in proxy.requests if r.startswith("503")]) == options.attempts
    _nothing_kept(options.cache_dir)


async def test_digest_mismatch_is_refused_and_nothing_kept(proxy: FaultProxy, options: ImageOptions) -> None:
    proxy.corrupt = True
    with pytest.raises(ImagePullError) as info:
        await pull(f"{proxy.host}/test/busybox:latest", options)
    assert info.value.infrastructure is True
    assert "hashes to" in str(info.value)
    _nothing_kept(options.cache_dir)
    assert list((options.cache_dir / "blobs" / "sha256").iterdir()) == []


async def test_no_registry_is_infrastructure(options: ImageOptions) -> None:
    with pytest.raises(ImagePullError) as info:
        await pull(f"127.0.0.1:{free_port()}/x/y:z", dataclasses.replace(options, attempts=2))
    assert info.value.infrastructure is True
    _nothing_kept(options.cache_dir)


async def test_mirror_serves_docker_hub_names(registry: Registry, images: Images, tmp_path: Path) -> None:
    """``busybox`` is ``docker.io/library/busybox``: with a docker.io mirror set in the environment
    it comes from the mirror, over plain HTTP for a loopback mirror."""
    from images.push import Pusher

    Pusher(registry.host).image("library/busybox", "1.36", images.busybox)
    env = {
        "CWSANDBOX_REGISTRY_MIRRORS": f"docker.io={registry.host}",
        "CWSANDBOX_IMAGE_CACHE": str(tmp_path / "c"),
        "HOME": str(tmp_path),
    }
    opts = ImageOptions.from_env(env, auth_files=())
    image = await pull("busybox:1.36", opts)
    assert image.reference == "docker.io/library/busybox:1.36"
    assert image.digest == images.busybox.digest
    record = json.loads(next((tmp_path / "c" / "images").iterdir()).read_text())
    assert record["reference"] == "docker.io/library/busybox:1.36"


async def test_a_stalled_request_meets_its_deadline_and_is_retried(
    proxy: FaultProxy, images: Images, options: ImageOptions
) -> None:
    proxy.stall_next(1, "/manifests/")
    proxy.stall_next(1, "/blobs/")
    opts = dataclasses.replace(options, request_timeout_seconds=2.0)
    image = await pull(f"{proxy.host}/test/busybox:latest", opts)
    assert image.digest == images.busybox.digest
    assert len([r for r in proxy.requests if r.startswith("stalled")]) == 2


async def test_the_pull_deadline_ends_a_pull_and_nothing_is_kept(proxy: FaultProxy, options: ImageOptions) -> None:
    proxy.blobs_wait_for_manifests = 1000  # no blob is ever served
    opts = dataclasses.replace(options, pull_timeout_seconds=1.0)
    with pytest.raises(ImagePullError) as info:
        await pull(f"{proxy.host}/test/layered:v1", opts)
    assert info.value.infrastructure is True
    assert "did not finish within" in str(info.value)
    _nothing_kept(options.cache_dir)


@pytest.mark.parametrize("by", ["reference", "index"])
async def test_a_manifest_that_is_not_its_digest_is_refused(
    proxy: FaultProxy, images: Images, options: ImageOptions, by: str
) -> None:
    """Asked by digest (in the reference, or through an index), a manifest must hash to it."""
    proxy.corrupt_manifests = True
    ref = f"{proxy.host}/test/layered@{images.layered.digest}" if by == "reference" else f"{proxy.host}/test/multi:v1"
    with pytest.raises(ImagePullError) as info:
        await pull(ref, options)
    assert info.value.infrastructure is True
    assert "not the sha256:" in str(info.value)
    _nothing_kept(options.cache_dir)


async def test_a_tqdm_bar_follows_the_pull(
    registry: Registry, images: Images, options: ImageOptions, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("tqdm", reason="the progress extra is not installed")
    bar = tqdm_progress("busybox")
    assert bar is not None
    await pull(f"{registry.host}/test/layered:v1", options, on_progress=bar)
    drawn = capsys.readouterr().err
    assert "busybox" in drawn and "layers 2/2" in drawn


async def test_a_repeated_layer_is_one_lowerdir(registry: Registry, options: ImageOptions) -> None:
    from images.build import Entry, make_image
    from images.push import Pusher

    empty: list[Entry] = []
    spec = make_image([empty, [Entry("f", data=b"1")], empty])
    Pusher(registry.host).image("test/repeated", "v1", spec)
    image = await pull(f"{registry.host}/test/repeated:v1", options)
    assert len(image.layers) == 3 and image.layers[0] == image.layers[2]
    assert image.lowerdirs == (image.layers[2], image.layers[1])
