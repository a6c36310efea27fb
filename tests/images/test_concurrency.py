"""One download per blob when many pull one image at once: tasks of one process, and processes."""

from __future__ import annotations

import collections
import subprocess
import sys
from pathlib import Path

import anyio

from cwsandbox_async.images import ImageOptions, pull
from images.conftest import Images
from images.servers import FaultProxy

PULL = """
import sys, anyio
from cwsandbox_async.images import ImageOptions, pull
async def main():
    image = await pull(sys.argv[1], ImageOptions.from_env())
    print(image.digest)
anyio.run(main)
"""


def _blob_gets(proxy: FaultProxy) -> collections.Counter[str]:
    return collections.Counter(r for r in proxy.requests if "/blobs/" in r and not r.startswith("503"))


async def test_tasks_of_one_process_download_each_blob_once(
    proxy: FaultProxy, images: Images, options: ImageOptions
) -> None:
    proxy.blobs_wait_for_manifests = 4
    digests: list[str] = []

    async def one() -> None:
        digests.append((await pull(f"{proxy.host}/test/layered:v1", options)).digest)

    async with anyio.create_task_group() as tg:
        for _ in range(4):
            tg.start_soon(one)
    assert digests == [images.layered.digest] * 4
    gets = _blob_gets(proxy)
    assert set(gets.values()) == {1}, gets
    assert len(gets) == 3  # two layers and the config


def test_two_processes_download_each_blob_once(proxy: FaultProxy, images: Images, tmp_path: Path) -> None:
    proxy.blobs_wait_for_manifests = 2
    env = {"CWSANDBOX_IMAGE_CACHE": str(tmp_path / "cache"), "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    ref = f"{proxy.host}/test/layered:v1"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", PULL, ref], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert [o[0].strip() for o in outs] == [images.layered.digest] * 2
    gets = _blob_gets(proxy)
    assert set(gets.values()) == {1}, gets
    assert len(gets) == 3
    assert sum(1 for r in proxy.requests if "/manifests/" in r) == 2  # both were in flight together
