"""The backend contract suite on FakeBackend."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from cwsandbox_async.testing import FakeBackend
from cwsandbox_async.testing.contract import BackendContract


class TestFakeBackendContract(BackendContract):
    has_bash = False  # its built-in shell runs a handful of commands

    @pytest.fixture
    async def backend(self) -> AsyncIterator[FakeBackend]:
        b = FakeBackend(seed=1)
        yield b
        await b.aclose()
        assert b.live == 0

    @pytest.fixture
    async def peer(self, backend: FakeBackend) -> AsyncIterator[FakeBackend]:
        b = FakeBackend(seed=2, world=backend.world)  # another process's view of the same sandboxes
        yield b
        await b.aclose()
