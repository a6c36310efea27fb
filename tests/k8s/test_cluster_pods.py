"""The shared watch and execs on the real control plane: bookmarks, abandoned execs,
pods that die mid-exec. The node's own view (its process list, its faults) is the referee."""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from guards import HANG_GUARD_SECONDS

from cwsandbox_async import SandboxNotRunningError
from cwsandbox_async.backends.kubernetes import KubernetesBackend
from cwsandbox_async.backends.kubernetes._watch import _Gone
from cwsandbox_async.testing.contract import make_request, make_spec

from .real import Tenant, tenant


@pytest.fixture
async def pod(real_cluster: Any) -> AsyncIterator[tuple[Tenant, KubernetesBackend, str]]:
    async with tenant(real_cluster) as t:
        backend = t.backend(watch_timeout_seconds=6)
        spec = make_spec("pods")
        try:
            await backend.create(spec)
            yield t, backend, spec.sandbox_id
        finally:
            await backend.destroy(spec.sandbox_id)
            await backend.aclose()
        await t.wait_no_pods()


async def test_bookmarks_carry_changes_the_selector_hides_and_the_watch_renews(
    pod: tuple[Tenant, KubernetesBackend, str],
) -> None:
    """kube-apiserver sends a watch a bookmark about 2 s before its ``timeoutSeconds`` (6 s here), but
    only when the pods' resourceVersion has moved on since the watch began: in a quiet cluster none
    comes (seen here: 1 bookmark in 9 watches). So another pod, which the backend's selector does not
    match, changes every half second: the backend sees none of it, yet each bookmark moves its resume
    point past it, and every watch resumes from there without relisting."""
    t, backend, sid = pod
    watch = backend.watch
    assert watch is not None
    other = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "other", "namespace": t.namespace},
        "spec": {"automountServiceAccountToken": False, "restartPolicy": "Never",
                 "containers": [{"name": "main", "image": "x", "command": ["sleep", "3600"]}]},
    }  # fmt: skip
    await anyio.to_thread.run_sync(lambda: t.cluster.kubectl("create", "-f", "-", input=json.dumps(other), check=True))

    async def churn() -> None:
        for n in itertools.count():
            await anyio.to_thread.run_sync(
                lambda n=n: t.cluster.kubectl("-n", t.namespace, "annotate", "--overwrite", "pod", "other", f"n={n}")
            )
            await anyio.sleep(0.5)

    watches, bookmarks = watch.watches, watch.bookmarks
    async with anyio.create_task_group() as tg:
        tg.start_soon(churn)
        with anyio.move_on_after(HANG_GUARD_SECONDS):
            while watch.bookmarks < bookmarks + 2 or watch.watches < watches + 2:  # noqa: ASYNC110
                await anyio.sleep(0.2)
        tg.cancel_scope.cancel()
    seen = (watch.watches - watches, watch.bookmarks - bookmarks, watch.relists)
    assert seen[0] >= 2 and seen[1] >= 2, f"in {HANG_GUARD_SECONDS} s: watches, bookmarks, relists = {seen}"
    assert watch.relists == 1  # resumed from the bookmark's resourceVersion each time, never relisted
    assert "other" not in watch.pods  # the selector hid it
    assert (await backend.exec(sid, make_request("true"))).returncode == 0
    await anyio.to_thread.run_sync(
        lambda: t.cluster.kubectl("-n", t.namespace, "delete", "pod", "other", "--grace-period=0", "--wait=false")
    )


async def test_abandoned_execs_leave_no_process_in_the_pod(pod: tuple[Tenant, KubernetesBackend, str]) -> None:
    t, backend, sid = pod
    with anyio.move_on_after(2):  # cancelled
        await backend.exec(sid, make_request("sleep", "601"))
    r = await backend.exec(sid, make_request("yes", max_output=4096))  # cut at the output cap
    assert r.truncated
    script = "python3 -c 'import os, time; os.setpgid(0, 0); time.sleep(603)' & sleep 602"
    r = await backend.exec(sid, make_request("/bin/sh", "-c", script, timeout=2))  # outlives its timeout
    assert r.timed_out
    markers = ("sleep 601", "yes", "sleep 602", "time.sleep(603)")
    left: list[str] = []
    with anyio.move_on_after(HANG_GUARD_SECONDS):
        while True:
            left = [p for p in await t.processes(sid) if any(m in p for m in markers)]
            if not left:
                break
            await anyio.sleep(0.5)
    assert left == [], left  # the node's view of the container, not the backend's
    assert (await backend.exec(sid, make_request("true"))).returncode == 0


async def _die_mid_exec(t: Tenant, backend: KubernetesBackend, sid: str, fault: str) -> Any:
    async def soon() -> None:
        await anyio.sleep(2)
        await anyio.to_thread.run_sync(lambda: t.cluster.fault(t.namespace, sid, fault))

    result: Any = None
    error: SandboxNotRunningError | None = None
    with anyio.fail_after(HANG_GUARD_SECONDS):
        async with anyio.create_task_group() as tg:
            tg.start_soon(soon)
            try:
                result = await backend.exec(sid, make_request("sleep", "600", timeout=600))
            except SandboxNotRunningError as exc:
                error = exc
    if error is not None:
        raise error
    return result


async def test_an_oom_kill_mid_exec_is_the_programs_result(pod: tuple[Tenant, KubernetesBackend, str]) -> None:
    t, backend, sid = pod
    r = await _die_mid_exec(t, backend, sid, "oom")
    assert r.oom_killed and r.returncode == -9


async def test_an_eviction_mid_exec_is_infrastructure(pod: tuple[Tenant, KubernetesBackend, str]) -> None:
    t, backend, sid = pod
    with pytest.raises(SandboxNotRunningError, match="Evicted") as info:
        await _die_mid_exec(t, backend, sid, "evict")
    assert info.value.infrastructure  # node pressure: the platform's


async def test_a_container_killed_mid_exec_is_infrastructure(pod: tuple[Tenant, KubernetesBackend, str]) -> None:
    t, backend, sid = pod
    with pytest.raises(SandboxNotRunningError) as info:
        await _die_mid_exec(t, backend, sid, "kill")
    assert info.value.infrastructure


async def test_one_watch_stream_per_backend_however_many_pods(real_cluster: Any) -> None:
    """The apiserver's own gauge of open pod watches is the referee: +1 while the backend runs 8 pods, +0 after."""
    from benchmarks._k8s_real import pod_watches

    async def open_watches() -> int:
        return pod_watches(await anyio.to_thread.run_sync(lambda: real_cluster.api_text("/metrics")))

    async def until(want: int) -> int:
        seen = -1
        with anyio.move_on_after(HANG_GUARD_SECONDS):
            while (seen := await open_watches()) != want:  # noqa: ASYNC110
                await anyio.sleep(0.5)
        return seen

    async with tenant(real_cluster) as t:
        baseline = await open_watches()
        backend = t.backend()
        try:
            specs = [make_spec("one-watch") for _ in range(8)]
            async with anyio.create_task_group() as tg:
                for spec in specs:
                    tg.start_soon(backend.create, spec)
            assert await until(baseline + 1) == baseline + 1
            assert backend.watch is not None and backend.watch.watches == 1
        finally:
            await backend.aclose()
        assert await until(baseline) == baseline
        await t.wait_no_pods()


async def test_a_watch_from_a_resource_version_too_old_is_410_inside_a_200_and_the_watch_relists(
    pod: tuple[Tenant, KubernetesBackend, str],
) -> None:
    """kube-apiserver's watch cache answers a watch from before its window with HTTP 200 and one
    ``ERROR`` event carrying a 410 Status (the test server can send it either way). The backend's
    watch reads that as "gone" and relists, as it does for an HTTP 410."""
    t, backend, sid = pod
    path = f"/api/v1/namespaces/{t.namespace}/pods?watch=1&resourceVersion=1&timeoutSeconds=5"
    raw = await anyio.to_thread.run_sync(lambda: t.cluster.api_text(path))  # admin: the raw bytes, read to the end
    (line,) = [ln for ln in raw.splitlines() if ln.strip()]
    event = json.loads(line)
    assert event["type"] == "ERROR"
    assert (event["object"]["kind"], event["object"]["code"], event["object"]["reason"]) == ("Status", 410, "Expired")
    watch = backend.watch
    assert watch is not None
    with pytest.raises(_Gone), anyio.fail_after(HANG_GUARD_SECONDS):
        await watch._watch_once("1")  # the backend's own request, on the backend's credentials
    relists = watch.relists
    assert (await backend.exec(sid, make_request("true"))).returncode == 0  # the shared watch is unharmed
    assert watch.relists == relists
