"""The backend contract suite on LocalBackend: bwrap with the agent, unshare, and the plain exec path."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from cwsandbox_async.backends.local import LocalBackend
from cwsandbox_async.testing.contract import BackendContract

from .conftest import requires_isolation


@requires_isolation
class TestLocalBackendContract(BackendContract):
    @pytest.fixture
    async def backend(self) -> AsyncIterator[LocalBackend]:
        b = LocalBackend()
        yield b
        await b.aclose()
        assert b._boxes == {}

    @pytest.fixture
    async def peer(self) -> AsyncIterator[LocalBackend]:
        b = LocalBackend()  # the same registry: another process's view (an attach opens a channel of its own)
        yield b
        await b.aclose()


@requires_isolation
class TestOneHostUidContract(BackendContract):
    """The template mapping one host uid (the driver's own), as it does for a non-root driver."""

    @pytest.fixture
    async def backend(self) -> AsyncIterator[LocalBackend]:
        b = LocalBackend(isolation="unshare", host_uid=None)
        yield b
        await b.aclose()
        assert b.isolation == "unshare" and b._boxes == {} and not b._ids.ranged

    @pytest.fixture
    async def peer(self) -> AsyncIterator[LocalBackend]:
        b = LocalBackend(isolation="unshare", host_uid=None)
        yield b
        await b.aclose()


@requires_isolation
class TestPlainExecContract(BackendContract):
    attachable = False  # no agent: nothing to attach to

    @pytest.fixture
    async def backend(self) -> AsyncIterator[LocalBackend]:
        b = LocalBackend(agent="plain")
        yield b
        await b.aclose()
        assert b._boxes == {}

    @pytest.fixture
    async def peer(self) -> AsyncIterator[LocalBackend]:
        b = LocalBackend(agent="plain")
        yield b
        await b.aclose()
