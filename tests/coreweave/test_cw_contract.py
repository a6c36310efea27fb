"""The backend contract suite against the CoreWeave test server (real gRPC, real local sandboxes)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from cwsandbox_async.backends.coreweave import CoreWeaveBackend
from cwsandbox_async.testing.contract import BackendContract

from .server import CoreWeaveTestServer


class TestCoreWeaveContract(BackendContract):
    create_timeout = 20.0

    @pytest.fixture
    async def backend(self, cw_server: CoreWeaveTestServer) -> AsyncIterator[CoreWeaveBackend]:
        b = CoreWeaveBackend(base_url=cw_server.url, ready_poll_seconds=0.02)
        yield b
        await b.aclose()
        assert cw_server.service.live() == [], "sandboxes left on the service"
        assert cw_server.service.active_execs == 0


class TestCoreWeaveContractStreaming(TestCoreWeaveContract):
    """The same contract with every exec on StreamExec."""

    @pytest.fixture
    async def backend(self, cw_server: CoreWeaveTestServer) -> AsyncIterator[CoreWeaveBackend]:
        b = CoreWeaveBackend(base_url=cw_server.url, ready_poll_seconds=0.02, exec_rpc="stream")
        yield b
        await b.aclose()
        assert cw_server.service.live() == [], "sandboxes left on the service"
