"""A pooled pod gets its lifetime at lease: a driver killed mid-lease cannot leave it running past the hold."""

from __future__ import annotations

from guards import HANG_GUARD_SECONDS

import cwsandbox_async as cwa

from .conftest import BackendFactory, needs_bwrap, wait_for, wait_no_pods
from .server import KubeTestServer

pytestmark = needs_bwrap


async def test_a_lease_sets_the_pods_deadline_from_its_hold_timeout(
    k8s_server: KubeTestServer, make_backend: BackendFactory
) -> None:
    async with (
        cwa.Session({"max_lifetime_seconds": 3600}, backend=make_backend(), handle_signals=False) as s,
        cwa.SandboxPool(s, size=2, lifetime_margin_seconds=30) as pool,
    ):
        await pool.wait_ready(timeout_seconds=HANG_GUARD_SECONDS)
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


async def test_a_fresh_pod_per_lease_costs_four_api_calls(
    k8s_server: KubeTestServer, make_backend: BackendFactory
) -> None:
    """Create, the lease's deadline (a PATCH: the pod's start time comes from the watch, no GET), one exec,
    delete. The shared watch's list and watch requests are per backend, not per lease."""
    async with (
        cwa.Session({"max_lifetime_seconds": 3600}, backend=make_backend(), handle_signals=False) as s,
        cwa.SandboxPool(s, size=2, max_size=4, lifetime_margin_seconds=30) as pool,
    ):
        await pool.wait_ready(timeout_seconds=HANG_GUARD_SECONDS)
        before = len([r for r in k8s_server.requests if not r.watch])
        leases = 6
        for _ in range(leases):
            async with pool.lease(hold_timeout_seconds=120) as sb:
                assert (await sb.exec(["true"])).returncode == 0
        await pool.wait_ready(timeout_seconds=HANG_GUARD_SECONDS)  # the replacements for the leased pods are up
        # a lease's pod is destroyed in the background after its release: the last one may still be going
        await wait_for(lambda: len([r for r in k8s_server.requests[before:] if r.method == "DELETE"]) >= leases)
        collection = "/api/v1/namespaces/default/pods"  # the watch's relists (per backend) are not per lease
        calls = [
            r for r in k8s_server.requests[before:] if not r.watch and not (r.method == "GET" and r.path == collection)
        ]
        per_lease = len(calls) / leases
        assert {r.method for r in calls} <= {"POST", "PATCH", "GET", "DELETE"}
        assert [r for r in calls if r.method == "GET" and not r.path.endswith("/exec")] == []  # no GET per lease
        assert per_lease <= 4, [(r.method, r.path) for r in calls]
        # one DELETE per pod: stale watch events after a destroy that went through do not "reap" it again
        assert len([r for r in calls if r.method == "DELETE"]) == leases
    await wait_no_pods(k8s_server)
