"""Backends for the integration tests: programs really run.

On the local backend they run in bwrap sandboxes; on the FakeBackend through a
handler that runs the command as a host subprocess (only the programs these
tests write). ``backend_name`` parametrizes a test over both.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from cwsandbox_async import SandboxBackendUnavailableError, Session
from cwsandbox_async.testing import FakeBackend


async def run_on_host(argv: tuple[str, ...], stdin: bytes, files: dict[str, bytes]) -> tuple[int, bytes, bytes]:
    """The FakeBackend's exec handler: run the command on the host, feeding it ``stdin``."""
    result = await anyio.run_process(list(argv), check=False, input=stdin or None)
    return result.returncode, result.stdout, result.stderr


def fake(**kw: Any) -> FakeBackend:
    """A FakeBackend whose commands run on the host."""
    return FakeBackend(exec_handler=run_on_host, **kw)


async def local_problem() -> str | None:
    """Why the local backend cannot run a sandbox here, or None when it can."""
    try:
        async with Session(backend="local") as s, s.sandbox():
            return None
    except SandboxBackendUnavailableError as exc:
        return str(exc)


@pytest.fixture(params=["fake", "local"])
def backend_name(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    if name == "local":
        problem = anyio.run(local_problem)
        if problem is not None:
            pytest.skip(f"local backend not available: {problem}")
    return name


def backend_for(name: str) -> FakeBackend | str:
    return fake() if name == "fake" else name


async def leftovers(name: str, backend: FakeBackend | str, tag: str) -> int:
    """Sandboxes still alive after everything closed: the fake's count, or a fresh local session's list."""
    if isinstance(backend, FakeBackend):
        return backend.live
    async with Session(backend=name) as s:
        return len(await s.list([tag]))
