"""Readiness comes from ONE shared watch per backend: no poll per pod, bookmarks kept, 410 relists."""

from __future__ import annotations

import anyio
from guards import HANG_GUARD_SECONDS

import cwsandbox_async as cwa
from cwsandbox_async.backends.kubernetes import KubernetesBackend
from cwsandbox_async.testing.contract import make_spec

from .conftest import BackendFactory, needs_bwrap, wait_for, wait_no_pods
from .server import KubeTestServer

pytestmark = needs_bwrap


async def test_many_pods_one_watch_no_polling(k8s_server: KubeTestServer, make_backend: BackendFactory) -> None:
    backend = make_backend()
    async with cwa.Session(backend=backend, handle_signals=False) as s:
        async with anyio.create_task_group() as tg:
            for _ in range(12):
                tg.start_soon(s.create_sandbox)
        assert len(s.sandboxes) == 12
        watches = k8s_server.calls("GET", r"/pods$", watch=True)
        lists = k8s_server.calls("GET", r"/pods$", watch=False)
        gets = k8s_server.calls("GET", r"/pods/sbx-[0-9a-f]+$")
        assert len(watches) == 1 and len(lists) == 1 and gets == []
        (w,) = watches
        assert (
            w.param("labelSelector")
            == f"app.kubernetes.io/managed-by=cwsandbox-async,cwsandbox.io/driver={backend.driver_id}"
        )
        assert w.param("allowWatchBookmarks") == "true" and w.param("resourceVersion")
    await wait_no_pods(k8s_server)


async def test_bookmarks_move_the_resume_point() -> None:
    server = KubeTestServer(bookmark_interval=0.05)
    await server.start()
    backend = KubernetesBackend(server=server.url, image="x", watch_timeout_seconds=1)
    try:
        spec = make_spec("bm")
        with anyio.fail_after(HANG_GUARD_SECONDS):
            await backend.create(spec)
            assert backend.watch is not None
            await wait_for(
                lambda: (
                    backend.watch is not None
                    and backend.watch.bookmarks >= 3
                    and len(server.calls("GET", r"/pods$", watch=True)) >= 2
                )
            )
        watches = server.calls("GET", r"/pods$", watch=True)
        # the server ended the first watch after timeoutSeconds; the next resumed from a resourceVersion,
        # without a relist
        assert watches[0].param("timeoutSeconds") == "1"
        assert watches[1].param("resourceVersion") and int(watches[1].param("resourceVersion") or 0) >= int(
            watches[0].param("resourceVersion") or 0
        )
        assert backend.watch.relists == 1
        await backend.destroy(spec.sandbox_id)
    finally:
        await backend.aclose()
        await server.stop()


async def test_a_dropped_watch_recovers(k8s_server: KubeTestServer, make_backend: BackendFactory) -> None:
    k8s_server.add_fault("drop", method="GET", path=r"/pods$", times=3)  # lists and watches alike
    backend = make_backend()
    async with cwa.Session(backend=backend, handle_signals=False) as s:
        sb = await s.sandbox()
        assert (await sb.exec(["true"])).returncode == 0
        await wait_for(lambda: backend.watch is not None and backend.watch.healthy)
        sb2 = await s.sandbox()
        assert (await sb2.exec(["true"])).returncode == 0
    await wait_no_pods(k8s_server)
