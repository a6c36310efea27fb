"""The backend contract on a real cluster. Opt-in: set CWSANDBOX_K8S_LIVE (KUBECONFIG alone never creates pods).

    CWSANDBOX_K8S_LIVE=1 pytest -m live_k8s tests/k8s/test_live.py  # $KUBECONFIG, ~/.kube/config, in-cluster
    CWSANDBOX_K8S_LIVE=/path/to/kubeconfig pytest -m live_k8s tests/k8s/test_live.py

Optional: CWSANDBOX_K8S_NAMESPACE (default: the context's), CWSANDBOX_K8S_IMAGE (default
python:3.12-slim; needs sh and coreutils), CWSANDBOX_K8S_RUNTIME_CLASS (e.g. gvisor).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from cwsandbox_async import SandboxCreationError
from cwsandbox_async.backends.kubernetes import KubernetesBackend
from cwsandbox_async.testing.contract import BackendContract, make_spec

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
