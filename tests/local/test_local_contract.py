"""The backend contract suite on LocalBackend (real bubblewrap sandboxes)."""

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
