"""Shared fixtures. anyio runs every async test on asyncio (we depend on aiohttp)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import structlog


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def _structlog_unconfigured() -> Iterator[None]:
    """Each test starts with structlog unconfigured, as an application that never set it up.

    ``structlog.testing.capture_logs`` restores the processors it replaced but leaves structlog
    *configured*, after which the library's events go to structlog's default printer instead of
    the ``cwsandbox_async`` stdlib logger (so ``caplog`` would see nothing in later tests)."""
    yield
    structlog.reset_defaults()
