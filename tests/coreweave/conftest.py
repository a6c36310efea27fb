"""Fixtures: a CoreWeave test server per test (real gRPC on 127.0.0.1, real local sandboxes)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

pytest.importorskip("cwsandbox", reason="the coreweave extra (cwsandbox, grpcio) is not installed")

from cwsandbox_async.backends.coreweave import CoreWeaveBackend

from .server import CoreWeaveTestServer

BackendFactory = Callable[..., CoreWeaveBackend]


@pytest.fixture
async def cw_server() -> AsyncIterator[CoreWeaveTestServer]:
    async with CoreWeaveTestServer() as server:
        yield server


@pytest.fixture
async def make_backend(cw_server: CoreWeaveTestServer) -> AsyncIterator[BackendFactory]:
    """Backends pointed at the test server; all closed afterwards."""
    made: list[CoreWeaveBackend] = []

    def make(**options: Any) -> CoreWeaveBackend:
        options.setdefault("base_url", cw_server.url)
        options.setdefault("ready_poll_seconds", 0.02)
        backend = CoreWeaveBackend(**options)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        await backend.aclose()
