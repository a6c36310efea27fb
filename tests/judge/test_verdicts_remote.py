"""Every verdict for Python and C++ through the Kubernetes API test server and the CoreWeave test server.

The same programs and cases as on the local backend (``programs.py``): the runner is sent as
``python3 -c`` over each backend's exec path (WebSocket exec through the API server, gRPC), and
the verdicts must come out the same. One sandbox per backend; one compile per language.
"""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator
from typing import Any

import pytest
from settling_loop import ASYNCIO

import cwsandbox_async as cwa
from cwsandbox_async.judge import Judge, Limits, Verdict

from .programs import BROKEN, CASES, EXPECTED, PROGRAMS

LIMITS = Limits(time_seconds=0.5, memory_mib=128)
DEFAULTS = cwa.SandboxDefaults(resources=cwa.Resources(memory_mib=1536, pids=256))


async def judge_both(session: cwa.Session) -> None:
    judge = Judge(session, limits=LIMITS)
    async with session.sandbox() as sb:
        for name in ("python", "cpp"):
            result = await judge.judge(PROGRAMS[name], name, CASES, sandbox=sb)
            got = [c.verdict for c in result.cases]
            assert got == EXPECTED, (name, [(c.name, c.verdict.value, c.detail) for c in result.cases])
            assert result.score == pytest.approx(1 / 6)
            broken = await judge.judge(BROKEN[name], name, CASES[:1], sandbox=sb)
            assert broken.verdict is Verdict.COMPILE_ERROR and broken.compile_output


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ASYNCIO


@pytest.fixture
async def k8s_session() -> AsyncIterator[cwa.Session]:
    from k8s.conftest import BWRAP, TEST_IMAGE
    from k8s.server import KubeTestServer

    if not BWRAP:
        pytest.skip("the test server runs pod commands in bubblewrap (unavailable)")
    from cwsandbox_async.backends.kubernetes import KubernetesBackend

    server = KubeTestServer()
    await server.start()
    backend = KubernetesBackend(server=server.url, image=TEST_IMAGE, namespace="default")
    try:
        async with cwa.Session(DEFAULTS, backend=backend) as session:
            yield session
        assert server.rejected == []
    finally:
        await backend.aclose()
        await server.stop()


@pytest.fixture
async def cw_session() -> AsyncIterator[cwa.Session]:
    if importlib.util.find_spec("cwsandbox") is None:
        pytest.skip("the coreweave extra (cwsandbox, grpcio) is not installed")
    from cwsandbox_async.backends.coreweave import CoreWeaveBackend
    from cwsandbox_async.testing.coreweave import CoreWeaveTestServer

    async with CoreWeaveTestServer() as server:
        backend = CoreWeaveBackend(base_url=server.url, ready_poll_seconds=0.02)
        try:
            async with cwa.Session(DEFAULTS, backend=backend) as session:
                yield session
        finally:
            await backend.aclose()


async def test_kubernetes_test_server(k8s_session: cwa.Session) -> None:
    await judge_both(k8s_session)


async def test_coreweave_test_server(cw_session: cwa.Session) -> None:
    await judge_both(cw_session)
