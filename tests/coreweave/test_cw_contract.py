"""The backend contract suite against the CoreWeave test server (real gRPC, real local sandboxes).

Three ways: every RPC served (exec on unary ``Exec``), and a server that serves only what the
``cwsandbox`` SDK 1.22 calls (unary ``Exec`` answers UNIMPLEMENTED) with the default
``exec_rpc="auto"`` (it falls back to ``StreamExec``) and with ``exec_rpc="stream"``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from cwsandbox_async.backends.coreweave import CoreWeaveBackend
from cwsandbox_async.testing.contract import BackendContract
from cwsandbox_async.testing.coreweave import CoreWeaveTestServer


class TestCoreWeaveContract(BackendContract):
    create_timeout = 20.0

    @pytest.fixture
    async def backend(self, cw_server: CoreWeaveTestServer) -> AsyncIterator[CoreWeaveBackend]:
        b = CoreWeaveBackend(base_url=cw_server.url, ready_poll_seconds=0.02)
        yield b
        await b.aclose()
        assert cw_server.service.live() == [], "sandboxes left on the service"
        assert cw_server.service.active_execs == 0


class TestCoreWeaveContractSdkRpcs(BackendContract):
    """The default options against a service that answers UNIMPLEMENTED to unary Exec."""

    create_timeout = 20.0
    exec_rpc = "auto"

    @pytest.fixture
    async def backend(self, cw_sdk_server: CoreWeaveTestServer) -> AsyncIterator[CoreWeaveBackend]:
        b = CoreWeaveBackend(base_url=cw_sdk_server.url, ready_poll_seconds=0.02, exec_rpc=self.exec_rpc)
        yield b
        await b.aclose()
        service = cw_sdk_server.service
        assert service.live() == [], "sandboxes left on the service"
        assert service.active_execs == 0
        if service.calls("Exec"):  # asked once (or by execs already in flight), then never again
            assert b.channel is not None and b.channel.unary_exec is False


class TestCoreWeaveContractSdkRpcsStreaming(TestCoreWeaveContractSdkRpcs):
    """The same contract with every exec on StreamExec."""

    exec_rpc = "stream"
