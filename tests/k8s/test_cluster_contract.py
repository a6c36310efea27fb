"""The backend contract suite on the real control plane, as a ServiceAccount with the docs' Role (no admin)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from cwsandbox_async.backends.kubernetes import KubernetesBackend
from cwsandbox_async.testing.contract import BackendContract

from .real import tenant


class TestClusterContract(BackendContract):
    create_timeout = 60.0

    @pytest.fixture
    async def backend(self, real_cluster: Any) -> AsyncIterator[KubernetesBackend]:
        async with tenant(real_cluster) as t:
            b = t.backend()
            try:
                yield b
            finally:
                await b.aclose()
            assert b.client is None or b.client.warnings == {}  # the real server had nothing to warn about
            assert b.watch is None or b.watch.denied is None
            await t.wait_no_pods()
