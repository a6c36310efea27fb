"""The backend contract suite against the Kubernetes API test server (real sockets, real processes)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from cwsandbox_async.backends.kubernetes import KubernetesBackend
from cwsandbox_async.testing.contract import BackendContract

from .conftest import TEST_IMAGE, needs_bwrap, wait_for, wait_no_pods
from .server import KubeTestServer


@needs_bwrap
class TestKubernetesBackendContract(BackendContract):
    create_timeout = 20.0

    @pytest.fixture
    async def backend(self, k8s_server: KubeTestServer) -> AsyncIterator[KubernetesBackend]:
        b = KubernetesBackend(server=k8s_server.url, image=TEST_IMAGE, namespace="default")
        yield b
        await b.aclose()
        assert k8s_server.rejected == []
        # every pod is gone or going, and no exec process outlives the test for long
        assert all(rt.obj["metadata"].get("deletionTimestamp") for rt in k8s_server.pods.values())
        await wait_for(lambda: all(not rt.execs for rt in k8s_server.pods.values()))
        await wait_no_pods(k8s_server)
