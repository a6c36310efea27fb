"""The cache: least-recently-used collection, held images, removal, the size cap."""

from __future__ import annotations

import dataclasses
import os
import time

from cwsandbox_async.images import ImageOptions, acquire, hold, list_images, prune, pull, remove
from images.build import Entry, make_image
from images.push import Pusher
from images.servers import Registry


def _push_three(registry: Registry) -> list[str]:
    pusher = Pusher(registry.host)
    shared = [Entry("shared", data=b"s" * 4096)]
    refs = []
    for name in ("one", "two", "three"):
        pusher.image(f"cache/{name}", "v1", make_image([shared, [Entry(name, data=name.encode() * 20000)]]))
        refs.append(f"{registry.host}/cache/{name}:v1")
    return refs


def _age(options: ImageOptions, order: list[str]) -> None:
    """Set last use: the first of ``order`` longest ago (record mtimes; no sleeping)."""
    base = time.time() - 1000
    for i, ref in enumerate(order):
        for path in (options.cache_dir / "images").iterdir():
            if ref in path.read_text():
                os.utime(path, (base + i, base + i))


def _blob_bytes(options: ImageOptions) -> int:
    return sum(os.path.getsize(p) for p in (options.cache_dir / "blobs" / "sha256").iterdir())


async def test_prune_removes_least_recently_used_first(registry: Registry, options: ImageOptions) -> None:
    one, two, three = _push_three(registry)
    images = {ref: await pull(ref, options) for ref in (one, two, three)}
    _age(options, [two, one, three])  # two is the least recently used
    sizes = {ref: image.size_bytes for ref, image in images.items()}
    total = _blob_bytes(options)
    result = await prune(total + sizes[one] + sizes[three] - 4096, options)  # the shared layer counts once
    assert result.removed == (two,)
    assert [c.reference for c in list_images(options)] == [one, three]
    assert all(layer.is_dir() for layer in images[one].layers + images[three].layers)
    assert not images[two].layers[1].exists(), "its own layer went"
    assert images[two].layers[0].is_dir(), "the layer it shares with the others stayed"
    assert result.freed_bytes > 0
    everything = await prune(0, options)
    assert set(everything.removed) == {one, three}
    assert list_images(options) == []
    assert list((options.cache_dir / "layers" / "sha256").iterdir()) == []


async def test_held_image_survives_prune_and_remove(registry: Registry, options: ImageOptions) -> None:
    one, two, _three = _push_three(registry)
    first = await pull(one, options)
    await pull(two, options)
    async with await hold(first, options):
        result = await prune(0, options)
        assert result.removed == (two,)
        assert await remove(one, options) is True
        assert all(layer.is_dir() for layer in first.layers), "held layers stay while held"
    await prune(0, options)
    assert not any(layer.exists() for layer in first.layers)


async def test_size_cap_collects_after_each_pull(registry: Registry, options: ImageOptions) -> None:
    one, two, three = _push_three(registry)
    capped = dataclasses.replace(options, max_cache_bytes=1)
    await pull(one, capped)
    await pull(two, capped)
    last = await pull(three, capped)
    assert [c.reference for c in list_images(options)] == [three], "only the image just pulled is kept"
    assert all(layer.is_dir() for layer in last.layers)


async def test_acquire_holds_from_the_pull_on(registry: Registry, options: ImageOptions) -> None:
    one, _two, _three = _push_three(registry)
    lease = await acquire(one, options)
    try:
        assert (await prune(0, options)).removed == ()
        assert all(layer.is_dir() for layer in lease.image.layers)
    finally:
        lease.release()
    lease.release()  # idempotent
    assert lease.released
    assert (await prune(0, options)).removed == (one,)
    assert not any(layer.exists() for layer in lease.image.layers)
