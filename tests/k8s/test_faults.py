"""Every injected fault ends in a retry that succeeds or a typed error within its deadline, with no pod left."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest
from guards import HANG_GUARD_SECONDS, LONG_SECONDS

import cwsandbox_async as cwa
from cwsandbox_async import (
    SandboxBackendUnavailableError,
    SandboxCreationError,
    SandboxNotRunningError,
    SandboxTimeoutError,
    SandboxTransportError,
)

from .conftest import BackendFactory, needs_bwrap, wait_for, wait_no_pods
from .server import KubeTestServer

pytestmark = needs_bwrap


def session(backend: Any, **defaults: Any) -> cwa.Session:
    return cwa.Session(defaults, backend=backend, handle_signals=False)


# -- API faults: retried until they succeed ---------------------------------------------
async def test_429_with_retry_after_is_honoured(k8s_server: KubeTestServer, make_backend: BackendFactory) -> None:
    k8s_server.add_fault("status", method="POST", path=r"/pods$", status=429, retry_after=1)
    async with session(make_backend()) as s:
        sb = await s.sandbox()
        assert (await sb.exec(["echo", "ok"])).stdout == "ok\n"
        posts = k8s_server.calls("POST", r"/pods$")
        assert len(posts) == 2
        assert posts[1].t - posts[0].t >= 0.95  # waited Retry-After (a lower bound; never an upper one)
    await wait_no_pods(k8s_server)


@pytest.mark.parametrize("kind", ["status", "drop"])
async def test_500_and_dropped_connections_are_retried(
    k8s_server: KubeTestServer, make_backend: BackendFactory, kind: str
) -> None:
    for method, path in (("POST", r"/pods$"), ("GET", r"/pods$"), ("DELETE", r"/pods/sbx")):
        k8s_server.add_fault(kind, method=method, path=path, status=500, times=2)
    backend = make_backend()
    async with session(backend) as s:
        sb = await s.sandbox()
        assert (await sb.exec(["true"])).returncode == 0
        assert [i.sandbox_id for i in await s.list([])] == [sb.sandbox_id]
    # aiohttp itself re-sends an idempotent request once when a reused keep-alive connection drops
    assert backend.client is not None and backend.client.retries >= (6 if kind == "status" else 2)
    assert all(f.times == 0 for f in k8s_server.faults)
    await wait_no_pods(k8s_server)


async def test_create_whose_reply_was_lost_adopts_its_own_pod(
    k8s_server: KubeTestServer, make_backend: BackendFactory
) -> None:
    k8s_server.add_fault("drop_after", method="POST", path=r"/pods$")
    async with session(make_backend()) as s:
        sb = await s.sandbox()
        assert (await sb.exec(["echo", "adopted"])).stdout == "adopted\n"
    posts = k8s_server.calls("POST", r"/pods$")
    assert len(posts) == 2  # the retry met 409 AlreadyExists and recognised the pod by its driver label
    await wait_no_pods(k8s_server)


async def test_persistent_500_is_a_typed_error_within_the_deadline(
    k8s_server: KubeTestServer, make_backend: BackendFactory
) -> None:
    k8s_server.add_fault("status", method="POST", status=500, times=100)
    with anyio.fail_after(HANG_GUARD_SECONDS):
        async with session(make_backend(max_retries=2)) as s:
            with pytest.raises(SandboxTransportError, match="500"):
                await s.sandbox()
    assert len(k8s_server.calls("POST")) == 3
    await wait_no_pods(k8s_server)


async def test_slow_api_hits_the_call_deadline(k8s_server: KubeTestServer, make_backend: BackendFactory) -> None:
    k8s_server.add_fault("slow", method="GET", seconds=LONG_SECONDS, times=100)
    backend = make_backend(request_timeout_seconds=0.3, max_retries=1)
    with anyio.fail_after(HANG_GUARD_SECONDS), pytest.raises(SandboxTimeoutError):
        await backend.status("sbx-000000000000")


async def test_unreachable_api_server_is_backend_unavailable(make_backend: BackendFactory) -> None:
    with anyio.fail_after(HANG_GUARD_SECONDS):
        backend = make_backend(server="http://127.0.0.1:9", max_retries=1)
        with pytest.raises(SandboxBackendUnavailableError, match="cannot reach"):
            await backend.list([])


async def test_rejected_credentials_are_backend_unavailable(make_backend: BackendFactory) -> None:
    server = KubeTestServer(tokens={"right"})
    await server.start()
    try:
        backend = make_backend(server=server.url, token="wrong")
        with pytest.raises(SandboxBackendUnavailableError, match="401") as info:
            await backend.list([])
        assert not info.value.infrastructure  # the caller's credentials, not the platform
        await backend.aclose()
        with pytest.raises(SandboxBackendUnavailableError, match="closed") as closed:
            await backend.list([])
        assert not closed.value.infrastructure  # using a closed backend: the caller's mistake
    finally:
        await server.stop()


# -- watch faults: relist and carry on ----------------------------------------------------
async def test_watch_410_relists(k8s_server: KubeTestServer, make_backend: BackendFactory) -> None:
    k8s_server.add_fault("watch_410", method="GET", times=2)
    backend = make_backend()
    async with session(backend) as s:
        sb = await s.sandbox()
        k8s_server.expire_watches()  # an ERROR 410 event on the open watch
        sb2 = await s.sandbox()
        assert (await sb2.exec(["true"])).returncode == 0 and sb.sandbox_id != sb2.sandbox_id
        assert backend.watch is not None
        await wait_for(lambda: backend.watch is not None and backend.watch.relists >= 3)
        assert k8s_server.calls("GET", r"/pods$", watch=False)  # relists happened
    await wait_no_pods(k8s_server)


# -- exec faults -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kind", "extra"),
    [
        ("exec_no_status", {}),
        ("exec_drop", {}),
        (
            "exec_status",
            {
                "status_json": {
                    "status": "Failure",
                    "reason": "InternalError",
                    "code": 500,
                    "message": "error executing command in container: not found",
                }
            },
        ),
    ],
)
async def test_exec_without_an_exit_code_is_a_transport_error(
    k8s_server: KubeTestServer, make_backend: BackendFactory, kind: str, extra: dict[str, Any]
) -> None:
    async with session(make_backend()) as s:
        sb = await s.sandbox()
        k8s_server.add_fault(kind, **extra)
        with pytest.raises(SandboxTransportError) as info:
            await sb.exec(["echo", "hi"])
        assert not isinstance(info.value, SandboxNotRunningError)
        assert (await sb.exec(["echo", "again"])).stdout == "again\n"  # the pod itself is fine
    await wait_no_pods(k8s_server)


# -- pod faults: typed errors, fast --------------------------------------------------------
@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("imagepull", "ImagePullBackOff"),
        ("unschedulable", "Unschedulable"),
        ("oomkilled", "OOMKilled"),
        ("createconfig", "CreateContainerConfigError"),
    ],
)
async def test_pods_that_cannot_start_fail_fast(
    k8s_server: KubeTestServer, make_backend: BackendFactory, fault: str, reason: str
) -> None:
    with anyio.fail_after(HANG_GUARD_SECONDS):  # not the create timeout
        async with session(make_backend(), create_timeout_seconds=LONG_SECONDS) as s:
            with pytest.raises(SandboxCreationError) as info:
                await s.sandbox(image=f"registry.test/fault-{fault}:1")
    assert info.value.reason in (reason, "ErrImagePull") if fault == "imagepull" else info.value.reason == reason
    await wait_no_pods(k8s_server)


async def test_unschedulable_is_tolerated_for_its_grace_period(
    k8s_server: KubeTestServer, make_backend: BackendFactory
) -> None:
    start = time.monotonic()
    async with session(make_backend(unschedulable_grace_seconds=0.5)) as s:
        with pytest.raises(SandboxCreationError, match="cannot be scheduled"):
            await s.sandbox(image="registry.test/fault-unschedulable")
    assert time.monotonic() - start >= 0.5
    await wait_no_pods(k8s_server)


async def test_pod_stuck_pending_times_out_and_is_deleted(
    k8s_server: KubeTestServer, make_backend: BackendFactory
) -> None:
    with anyio.fail_after(HANG_GUARD_SECONDS):
        async with session(make_backend(), create_timeout_seconds=1.5) as s:
            with pytest.raises(SandboxTimeoutError, match=r"ContainerCreating|did not finish"):
                await s.sandbox(image="registry.test/fault-stuck")
    await wait_no_pods(k8s_server)


DEATHS = ["status", "hang", "close"]  # how a real exec stream reports its container's death


@pytest.mark.parametrize("death", DEATHS)
async def test_eviction_mid_exec_is_the_platforms_fault(
    k8s_server: KubeTestServer, make_backend: BackendFactory, death: str
) -> None:
    k8s_server.on_container_death = death
    async with session(make_backend()) as s:
        sb = await s.sandbox(image="registry.test/fault-evict:0.5")
        # Neither the sleep nor the exec's deadline is waited out.
        with anyio.fail_after(HANG_GUARD_SECONDS), pytest.raises(SandboxNotRunningError, match="Evicted") as info:
            await sb.exec(["sleep", str(LONG_SECONDS)], timeout_seconds=LONG_SECONDS)
        assert info.value.infrastructure is True
        assert await sb.refresh_status() is cwa.SandboxStatus.FAILED
        with pytest.raises(SandboxNotRunningError):
            await sb.exec(["true"])
    await wait_no_pods(k8s_server)


@pytest.mark.parametrize("death", DEATHS)
async def test_an_oom_kill_mid_exec_is_the_programs_result(
    k8s_server: KubeTestServer, make_backend: BackendFactory, death: str
) -> None:
    k8s_server.on_container_death = death
    async with session(make_backend()) as s:
        sb = await s.sandbox(image="registry.test/fault-oom:0.5")
        with anyio.fail_after(HANG_GUARD_SECONDS):
            r = await sb.exec(["sleep", str(LONG_SECONDS)], timeout_seconds=LONG_SECONDS)
        assert (r.oom_killed, r.returncode, r.timed_out) == (True, -9, False)
        # the sandbox died of its own program's memory: not the platform's fault either
        with pytest.raises(SandboxNotRunningError, match="OOMKilled") as info:
            await sb.exec(["true"])
        assert info.value.infrastructure is False
    await wait_no_pods(k8s_server)


async def test_an_eviction_the_program_caused_is_not_infrastructure(
    k8s_server: KubeTestServer, make_backend: BackendFactory
) -> None:
    async with session(make_backend()) as s:
        sb = await s.sandbox()

        async def fill_the_disk() -> None:
            await wait_for(lambda: any("sleep 30" in c for _, c in k8s_server.processes(sb.sandbox_id)))
            message = 'Usage of EmptyDir volume "workspace" exceeds the limit "512Mi". '
            await k8s_server.evict(sb.sandbox_id, message=message)

        async with anyio.create_task_group() as tg:
            tg.start_soon(fill_the_disk)
            with pytest.raises(SandboxNotRunningError, match="exceeds the limit") as info:
                await sb.exec(["sleep", "30"])
        assert info.value.infrastructure is False
    await wait_no_pods(k8s_server)


async def test_deadline_exceeded_ends_the_sandbox(k8s_server: KubeTestServer, make_backend: BackendFactory) -> None:
    backend = make_backend()
    async with session(backend, max_lifetime_seconds=1) as s:
        sb = await s.sandbox()
        assert k8s_server.pod(sb.sandbox_id)["spec"]["activeDeadlineSeconds"] == 1
        await wait_for(lambda: k8s_server.pod(sb.sandbox_id)["status"].get("reason") == "DeadlineExceeded")
        with pytest.raises(SandboxNotRunningError, match="DeadlineExceeded"):
            await sb.exec(["true"])
        assert await backend.status(sb.sandbox_id) is cwa.SandboxStatus.FAILED
    await wait_no_pods(k8s_server)


async def test_a_pod_deleted_behind_our_back_is_not_running(
    k8s_server: KubeTestServer, make_backend: BackendFactory
) -> None:
    async with session(make_backend()) as s:
        sb = await s.sandbox()
        rt = k8s_server.pods[("default", sb.sandbox_id)]
        async with anyio.create_task_group() as tg:

            async def delete_soon() -> None:
                await anyio.sleep(0.3)
                from .server import KubeTestServer as _S

                await _S._delete(k8s_server, rt, 0)

            tg.start_soon(delete_soon)
            with pytest.raises(SandboxNotRunningError):
                await sb.exec(["sleep", "30"])
    await wait_no_pods(k8s_server)


async def test_set_lifetime_patches_the_hard_ttl(k8s_server: KubeTestServer, make_backend: BackendFactory) -> None:
    from cwsandbox_async import SandboxValidationError
    from cwsandbox_async.testing.contract import make_spec

    backend = make_backend(default_lifetime_seconds=7200)
    spec = make_spec("ttl", max_lifetime_seconds=None)  # a pooled pod: its lease sets the real TTL
    sid = spec.sandbox_id
    await backend.create(spec)
    assert k8s_server.pod(sid)["spec"]["activeDeadlineSeconds"] == 7200  # never without one
    await backend.set_lifetime(sid, None)  # no lease limit: the default stays
    assert k8s_server.calls("PATCH") == []
    await backend.set_lifetime(sid, 600)
    assert 600 <= k8s_server.pod(sid)["spec"]["activeDeadlineSeconds"] <= 610
    (patch,) = k8s_server.calls("PATCH")
    assert patch.headers["Content-Type"] == "application/merge-patch+json"
    with pytest.raises(SandboxValidationError, match="cannot extend"):
        await backend.set_lifetime(sid, 3600)  # Kubernetes only lets the deadline shrink
    assert 600 <= k8s_server.pod(sid)["spec"]["activeDeadlineSeconds"] <= 610
    await backend.set_lifetime(sid, 0.5)
    await wait_for(lambda: k8s_server.pod(sid)["status"].get("reason") == "DeadlineExceeded")
    await backend.destroy(sid)
    with pytest.raises(SandboxNotRunningError):
        await backend.set_lifetime(sid, 10)
    await wait_no_pods(k8s_server)


async def test_forbidden_is_typed_by_what_was_refused(k8s_server: KubeTestServer, make_backend: BackendFactory) -> None:
    backend = make_backend()
    k8s_server.add_fault("status", method="GET", path=r"/pods$", status=403)
    with pytest.raises(SandboxBackendUnavailableError, match="RBAC") as rbac:
        await backend.list([])
    assert not rbac.value.infrastructure  # the caller's RBAC rules
    async with session(backend) as s:
        k8s_server.add_fault("status", method="POST", status=403)  # e.g. admission: PodSecurity, quota
        with pytest.raises(SandboxCreationError) as info:
            await s.sandbox()
        assert info.value.reason == "Forbidden" and not info.value.infrastructure  # admission policy: the caller's
        k8s_server.add_fault("status", method="POST", status=422)  # the spec asked for is invalid
        with pytest.raises(SandboxCreationError) as invalid:
            await s.sandbox()
        assert not invalid.value.infrastructure  # the caller's spec
        sb = await s.sandbox()
        k8s_server.add_fault("status", method="GET", path=r"/exec$", status=403)
        with pytest.raises(SandboxBackendUnavailableError, match="pods/exec") as exec_rbac:
            await sb.exec(["true"])
        assert not exec_rbac.value.infrastructure  # the caller's RBAC rules
    await wait_no_pods(k8s_server)
