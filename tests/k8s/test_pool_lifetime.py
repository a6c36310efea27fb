"""A pooled pod gets its lifetime at lease: a driver killed mid-lease cannot leave it running past the hold."""

from __future__ import annotations

import cwsandbox_async as cwa

from .conftest import BackendFactory, needs_bwrap, wait_no_pods
from .server import KubeTestServer

pytestmark = needs_bwrap


async def test_a_lease_sets_the_pods_deadline_from_its_hold_timeout(
    k8s_server: KubeTestServer, make_backend: BackendFactory
) -> None:
    async with (
        cwa.Session({"max_lifetime_seconds": 3600}, backend=make_backend(), handle_signals=False) as s,
        cwa.SandboxPool(s, size=2, lifetime_margin_seconds=30) as pool,
    ):
        await pool.wait_ready(timeout_seconds=30)
        idle = k8s_server.live_pods()
        assert all(k8s_server.pod(name)["spec"]["activeDeadlineSeconds"] == 3600 for name in idle)
        async with pool.lease(hold_timeout_seconds=120) as sb:
            deadline = k8s_server.pod(sb.sandbox_id)["spec"]["activeDeadlineSeconds"]
            assert 150 <= deadline <= 160  # hold + margin, counted from the pod's start
            assert (await sb.exec(["true"])).returncode == 0
        async with pool.lease() as sb:  # no hold timeout: no PATCH, the pod keeps the TTL it was created with
            assert k8s_server.pod(sb.sandbox_id)["spec"]["activeDeadlineSeconds"] == 3600
        assert len(k8s_server.calls("PATCH")) == 1
    await wait_no_pods(k8s_server)


async def test_a_reused_pod_whose_deadline_cannot_be_extended_is_replaced(
    k8s_server: KubeTestServer, make_backend: BackendFactory
) -> None:
    async with (
        cwa.Session({"max_lifetime_seconds": 3600}, backend=make_backend(), handle_signals=False) as s,
        cwa.SandboxPool(s, size=1, max_size=1, reuse=True, lifetime_margin_seconds=30) as pool,
    ):
        async with pool.lease(hold_timeout_seconds=60) as first:
            pass
        async with pool.lease(hold_timeout_seconds=600) as second:  # Kubernetes only lets a deadline shrink
            assert second.sandbox_id != first.sandbox_id
            assert 630 <= k8s_server.pod(second.sandbox_id)["spec"]["activeDeadlineSeconds"] <= 640
        assert pool.statistics().discarded == 1
    await wait_no_pods(k8s_server)
