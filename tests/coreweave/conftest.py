"""Fixtures: a CoreWeave test server per test (real gRPC on 127.0.0.1, real local sandboxes).

``cw_server`` serves every RPC this backend can use (unary ``Exec`` and ``PurgeSandboxes``
too); ``cw_sdk_server`` only those the ``cwsandbox`` SDK 1.22 calls, as the service is known to.
``make_backend`` points at ``cw_server``; ``make_sdk_backend`` at ``cw_sdk_server``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

pytest.importorskip("cwsandbox", reason="the coreweave extra (cwsandbox, grpcio) is not installed")

from cwsandbox_async.backends.coreweave import CoreWeaveBackend
from cwsandbox_async.testing.coreweave import CoreWeaveTestServer

BackendFactory = Callable[..., CoreWeaveBackend]


@pytest.fixture
async def cw_server() -> AsyncIterator[CoreWeaveTestServer]:
    async with CoreWeaveTestServer(rpcs="all") as server:
        yield server


@pytest.fixture
async def cw_sdk_server() -> AsyncIterator[CoreWeaveTestServer]:
    async with CoreWeaveTestServer(rpcs="sdk") as server:
        yield server


@pytest.fixture
async def make_backend(cw_server: CoreWeaveTestServer) -> AsyncIterator[BackendFactory]:
    """Backends pointed at the test server; all closed afterwards."""
    async for make in _factory(cw_server):
        yield make


@pytest.fixture
async def make_sdk_backend(cw_sdk_server: CoreWeaveTestServer) -> AsyncIterator[BackendFactory]:
    """Backends pointed at the test server that serves only the SDK's RPCs; all closed afterwards."""
    async for make in _factory(cw_sdk_server):
        yield make


async def _factory(server: CoreWeaveTestServer) -> AsyncIterator[BackendFactory]:
    made: list[CoreWeaveBackend] = []

    def make(**options: Any) -> CoreWeaveBackend:
        options.setdefault("base_url", server.url)
        options.setdefault("ready_poll_seconds", 0.02)
        backend = CoreWeaveBackend(**options)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        await backend.aclose()
