"""Shared fixtures. anyio runs every async test on asyncio (we depend on aiohttp)."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
