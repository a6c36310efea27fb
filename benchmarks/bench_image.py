"""Local sandboxes from a cached image against host-root sandboxes, in one run.

A real registry (Debian's ``docker-registry``, started on 127.0.0.1 by the image tests' helper) serves
a busybox image of two layers (built offline, as the image tests build theirs); it is pulled once, so
every create below finds it cached. Then, alternating one of each per round so both see the same
machine load:

- ``create``: ``Session.sandbox()`` until the sandbox is ready to run commands, host root
  (``image=None``) against the image (its overlay root, upper, pivot), each stopped after (not timed);
- ``idle memory``: PSS of N live sandboxes of each kind (their PID 1's, from ``smaps_rollup``);
- ``disk``: the image cache's bytes on disk before and with 100 live sandboxes of the image (the
  uppers are tmpfs: what the sandboxes write is memory, bounded by ``workspace_mib``).

    python -m benchmarks.bench_image [--quick]

Writes ``benchmarks/out/image.json`` (headline: ``create_p50_ratio``, ``idle_pss_ratio``,
``disk_growth_bytes_100``). Needs the ``docker-registry`` binary (exits with a message without it).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import cwsandbox_async as cwa
from cwsandbox_async.backends.local import LocalBackend
from cwsandbox_async.images import ImageOptions, pull

from ._common import parse_args, percentile, write_json
from ._procstat import measure_trees

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from images.build import Entry, busybox_layer, make_image
from images.push import Pusher
from images.servers import REGISTRY_BINARY, Registry


def _du(path: Path) -> int:
    out = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True, timeout=120)
    return int(out.stdout.split()[0])


async def _create(session: cwa.Session, image: str | None) -> float:
    start = time.perf_counter()
    sb = await session.sandbox(image=image)
    took = time.perf_counter() - start
    await sb.stop()
    return took


async def _idle(session: cwa.Session, image: str | None, n: int) -> dict[str, float]:
    boxes = [await session.sandbox(image=image) for _ in range(n)]
    await asyncio.sleep(1.0)
    pids = [session.backend._boxes[sb.sandbox_id].runner.pid for sb in boxes]  # type: ignore[attr-defined]
    totals = measure_trees(p for p in pids if p)
    for sb in boxes:
        await sb.stop()
    return totals.per(n)


async def main() -> None:
    args = parse_args(__doc__ or "")
    if REGISTRY_BINARY is None:
        raise SystemExit("bench_image needs the distribution registry (apt-get install docker-registry)")
    rounds, idle_n, disk_n = (10, 10, 100) if args.quick else (40, 30, 100)
    with tempfile.TemporaryDirectory() as tmp:
        registry = Registry(Path(tmp) / "registry")
        try:
            app = [Entry("app", "dir", mode=0o755), Entry("app/hello.txt", data=b"hello\n")]
            spec = make_image([busybox_layer(), app], config={"Env": ["PATH=/bin"], "WorkingDir": "/app"})
            Pusher(registry.host).image("bench/busybox", "v1", spec)
            ref = f"{registry.host}/bench/busybox:v1"
            options = ImageOptions(cache_dir=Path(tmp) / "cache", auth_files=())
            await pull(ref, options)
            result = await _measure(ref, options, rounds, idle_n, disk_n)
        finally:
            registry.stop()
    path = write_json("image", result)
    print(
        f"create p50: host root {result['create_host_p50_ms']} ms, image {result['create_image_p50_ms']} ms "
        f"({result['create_p50_ratio']}x); idle PSS ratio {result['idle_pss_ratio']}; "
        f"disk growth with {disk_n} image sandboxes: {result['disk_growth_bytes_100']} B; {path}"
    )


async def _measure(ref: str, options: ImageOptions, rounds: int, idle_n: int, disk_n: int) -> dict[str, Any]:
    host: list[float] = []
    image: list[float] = []
    async with cwa.Session(backend=LocalBackend(images=options), handle_signals=False) as session:
        await _create(session, None)  # the template starts
        await _create(session, ref)
        for _ in range(rounds):
            host.append(await _create(session, None))
            image.append(await _create(session, ref))
        idle_host = await _idle(session, None, idle_n)
        idle_image = await _idle(session, ref, idle_n)
        before = _du(options.cache_dir)
        boxes = [await session.sandbox(image=ref) for _ in range(disk_n)]
        write = [sb.exec(["sh", "-c", "echo written > /app/mine"]) for sb in boxes]
        await asyncio.gather(*write)
        with_live = _du(options.cache_dir)
        for sb in boxes:
            await sb.stop()
    host_p50, image_p50 = percentile(host, 50), percentile(image, 50)
    return {
        "rounds": rounds,
        "create_host_p50_ms": round(host_p50 * 1000, 2),
        "create_image_p50_ms": round(image_p50 * 1000, 2),
        "create_host_p90_ms": round(percentile(host, 90) * 1000, 2),
        "create_image_p90_ms": round(percentile(image, 90) * 1000, 2),
        "create_p50_ratio": round(image_p50 / host_p50, 3),
        "idle_host": idle_host,
        "idle_image": idle_image,
        "idle_pss_ratio": round(idle_image["pss_mib"] / idle_host["pss_mib"], 3),
        "cache_bytes": before,
        "disk_growth_bytes_100": with_live - before,
        "sandboxes_for_disk": disk_n,
    }


if __name__ == "__main__":
    asyncio.run(main())
