"""Shared fixtures. anyio runs every async test on asyncio (we depend on aiohttp)."""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import pytest
import structlog

from cwsandbox_async import SandboxBackendUnavailableError, Session

# The cluster tier's `real_cluster` fixture (a real kube-apiserver for the session), for any test.
pytest_plugins = ["cluster.plugin"]


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


async def _local_problem() -> str | None:
    try:
        async with Session(backend="local") as s, s.sandbox():
            return None
    except SandboxBackendUnavailableError as exc:
        return str(exc)


@pytest.fixture(scope="module")
def local_backend() -> None:
    """Examples and docs blocks run on the local backend by default; skip (with the reason) where it
    cannot start."""
    problem = anyio.run(_local_problem)
    if problem is not None:
        pytest.skip(f"local backend not available: {problem}")
