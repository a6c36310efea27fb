"""The backend contract on a real cluster. Opt-in: set CWSANDBOX_K8S_LIVE (KUBECONFIG alone never creates pods).

    CWSANDBOX_K8S_LIVE=1 pytest -m live_k8s tests/k8s/test_live.py  # $KUBECONFIG, ~/.kube/config, in-cluster
    CWSANDBOX_K8S_LIVE=/path/to/kubeconfig pytest -m live_k8s tests/k8s/test_live.py

Optional: CWSANDBOX_K8S_NAMESPACE (default: the context's), CWSANDBOX_K8S_IMAGE (default
python:3.12-slim; needs sh, coreutils and python3), CWSANDBOX_K8S_RUNTIME_CLASS (e.g. gvisor).
The RBAC the suite needs: pods create/get/list/watch/patch/delete/deletecollection,
pods/exec get/create, pods/eviction create.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from guards import HANG_GUARD_SECONDS

from cwsandbox_async import SandboxCreationError, SandboxNotRunningError
from cwsandbox_async.backends.kubernetes import KubernetesBackend
from cwsandbox_async.testing.contract import BackendContract, make_request, make_spec

LIVE = os.environ.get("CWSANDBOX_K8S_LIVE", "")

pytestmark = [
    pytest.mark.live_k8s,
    pytest.mark.skipif(not LIVE, reason="set CWSANDBOX_K8S_LIVE=1 (or a kubeconfig path) to run against a cluster"),
]


def live_options() -> dict[str, Any]:
    options: dict[str, Any] = {"image": os.environ.get("CWSANDBOX_K8S_IMAGE", "python:3.12-slim")}
    if LIVE not in ("1", "true", "yes"):
        options["kubeconfig"] = LIVE
    if ns := os.environ.get("CWSANDBOX_K8S_NAMESPACE"):
        options["namespace"] = ns
    if rc := os.environ.get("CWSANDBOX_K8S_RUNTIME_CLASS"):
        options["runtime_class_name"] = rc
    return options


class TestLiveKubernetesContract(BackendContract):
    create_timeout = 300.0  # a cold image pull

    @pytest.fixture
    async def backend(self) -> AsyncIterator[KubernetesBackend]:
        b = KubernetesBackend(**live_options())
        yield b
        await b.aclose()


async def test_live_image_pull_failure_is_typed() -> None:
    backend = KubernetesBackend(**{**live_options(), "image": f"registry.invalid/cwsandbox-{uuid.uuid4().hex[:6]}:0"})
    spec = make_spec("live-pull", create_timeout_seconds=120)
    try:
        with pytest.raises(SandboxCreationError) as info:
            await backend.create(spec)
        assert info.value.reason in ("ErrImagePull", "ImagePullBackOff", "InvalidImageName")
    finally:
        await backend.destroy(spec.sandbox_id)
        await backend.aclose()


async def test_live_sweep_finds_a_crashed_drivers_pod() -> None:
    tag = f"live-sweep-{uuid.uuid4().hex[:6]}"
    crashed = KubernetesBackend(**live_options(), sweep_on_close=False)
    spec = make_spec(tag, create_timeout_seconds=300)
    await crashed.create(spec)
    await crashed.aclose()
    survivor = KubernetesBackend(**live_options())
    try:
        assert [i.sandbox_id for i in await survivor.list([tag])] == [spec.sandbox_id]
        assert await survivor.sweep([tag]) == [spec.sandbox_id]
        assert await survivor.list([tag]) == []
    finally:
        await survivor.aclose()


# -- what a real kubelet does that a simple fake would not ---------------------------------------
PROCESSES = "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done 2>/dev/null"


@pytest.fixture
async def live_pod() -> AsyncIterator[tuple[KubernetesBackend, str]]:
    backend = KubernetesBackend(**live_options())
    spec = make_spec("live-abandon", create_timeout_seconds=300)
    try:
        await backend.create(spec)
        yield backend, spec.sandbox_id
    finally:
        await backend.destroy(spec.sandbox_id)
        await backend.aclose()


async def processes(backend: KubernetesBackend, sid: str) -> str:
    return (await backend.exec(sid, make_request("/bin/sh", "-c", PROCESSES))).stdout.decode()


async def test_live_abandoned_execs_leave_no_process(live_pod: tuple[KubernetesBackend, str]) -> None:
    backend, sid = live_pod
    with anyio.move_on_after(2):  # cancelled
        await backend.exec(sid, make_request("sleep", "601"))
    r = await backend.exec(sid, make_request("yes", max_output=4096))  # cut at the output cap
    assert r.truncated
    script = "python3 -c 'import os, time; os.setpgid(0, 0); time.sleep(603)' & sleep 602"
    r = await backend.exec(sid, make_request("/bin/sh", "-c", script, timeout=2))  # outlives its timeout
    assert r.timed_out
    with anyio.fail_after(HANG_GUARD_SECONDS):
        while True:
            left = await processes(backend, sid)
            if not any(marker in left for marker in ("sleep 601", "yes", "sleep 602", "time.sleep(603)")):
                break
            await anyio.sleep(1)


async def test_live_eviction_mid_exec_is_not_running(live_pod: tuple[KubernetesBackend, str]) -> None:
    backend, sid = live_pod
    client, ns = await backend._ensure()
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": sid, "namespace": ns}}

    async def evict_soon() -> None:
        await anyio.sleep(3)
        await client.request("POST", f"/api/v1/namespaces/{ns}/pods/{sid}/eviction", body=body, what="evict")

    with anyio.fail_after(HANG_GUARD_SECONDS):
        async with anyio.create_task_group() as tg:
            tg.start_soon(evict_soon)
            with pytest.raises(SandboxNotRunningError):
                await backend.exec(sid, make_request("sleep", "600", timeout=600))
