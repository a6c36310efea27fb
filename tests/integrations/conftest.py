"""Backends for the integration tests: programs really run.

On the local backend they run in bwrap sandboxes; on the FakeBackend through a
handler that runs the command as a host subprocess (only the programs these
tests write); on the Kubernetes backend against the API test server, which runs
each exec as a real process; on the CoreWeave backend against its gRPC test
server. ``backend_name`` parametrizes a test over the fake and local backends,
``program_backend`` over all four.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from k8s.conftest import BWRAP, TEST_IMAGE
from k8s.server import KubeTestServer

from cwsandbox_async import SandboxBackendUnavailableError, Session
from cwsandbox_async.backends.base import Backend
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


@pytest.fixture
async def local_only() -> None:
    """Skip (with the reason) where the local backend cannot run a sandbox."""
    problem = await local_problem()
    if problem is not None:
        pytest.skip(f"local backend not available: {problem}")


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


@pytest.fixture(params=["fake", "local", "kubernetes", "coreweave"])
async def program_backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend | str]:
    """A backend that really runs programs: the fake (on the host), local, Kubernetes (the API test server),
    or CoreWeave (its gRPC test server, which runs each exec in a local sandbox)."""
    name: str = request.param
    if name == "fake":
        yield fake()
    elif name == "local":
        problem = await local_problem()
        if problem is not None:
            pytest.skip(f"local backend not available: {problem}")
        yield "local"
    elif name == "coreweave":
        pytest.importorskip("cwsandbox", reason="the coreweave extra (cwsandbox, grpcio) is not installed")
        problem = await local_problem()
        if problem is not None:
            pytest.skip(f"the CoreWeave test server runs execs in local sandboxes: {problem}")
        from coreweave.server import CoreWeaveTestServer

        from cwsandbox_async.backends.coreweave import CoreWeaveBackend

        async with CoreWeaveTestServer() as cw_server:
            cw = CoreWeaveBackend(base_url=cw_server.url, ready_poll_seconds=0.02)
            try:
                yield cw
            finally:
                await cw.aclose()
    else:
        if not BWRAP:
            pytest.skip("the Kubernetes test server runs pod commands in bubblewrap (unavailable)")
        from cwsandbox_async.backends.kubernetes import KubernetesBackend

        server = KubeTestServer()
        await server.start()
        backend = KubernetesBackend(server=server.url, image=TEST_IMAGE, namespace="default")
        try:
            yield backend
        finally:
            await backend.aclose()
            await server.stop()
