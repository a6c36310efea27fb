"""Nothing leaks: after many lifecycles and a close, no file descriptor, task, process or pod is left."""

from __future__ import annotations

import asyncio
import gc
import os

import anyio

import cwsandbox_async as cwa

from .conftest import BackendFactory, needs_bwrap, wait_for, wait_no_pods
from .server import KubeTestServer

pytestmark = needs_bwrap


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def lifecycle(backend: object, n: int) -> None:
    async with cwa.Session(backend=backend, handle_signals=False) as s:  # type: ignore[arg-type]

        async def one(i: int) -> None:
            async with s.sandbox() as sb:
                await sb.exec(["echo", str(i)])
                await sb.write_file("/tmp/x", b"x")
                assert await sb.read_file("/tmp/x") == b"x"
                with anyio.move_on_after(0.2):  # a cancelled exec too
                    await sb.exec(["sleep", "30"])

        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(one, i)


async def test_no_fd_task_process_or_pod_leaks(k8s_server: KubeTestServer, make_backend: BackendFactory) -> None:
    await lifecycle(make_backend(), 2)  # warm up: imports, thread pool, the server's listeners
    await wait_no_pods(k8s_server)
    gc.collect()
    fds, tasks = open_fds(), len(asyncio.all_tasks())
    await lifecycle(make_backend(), 12)
    await wait_no_pods(k8s_server)
    await wait_for(lambda: all(not rt.execs for rt in k8s_server.pods.values()))
    gc.collect()
    await wait_for(lambda: open_fds() <= fds + 2 and len(asyncio.all_tasks()) <= tasks)
