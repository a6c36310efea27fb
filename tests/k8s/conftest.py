"""Fixtures: a fresh Kubernetes API test server per test, and backends pointed at it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from cwsandbox_async.backends.kubernetes import KubernetesBackend

from .exec_server import ExecRunner
from .server import KubeTestServer


def _bwrap_works() -> bool:
    """bwrap is there and may create the user and PID namespaces the test server's pods use."""
    import subprocess

    path = ExecRunner().bwrap
    if path is None:
        return False
    probe = [path, "--unshare-user", "--unshare-pid", "--ro-bind", "/usr", "/usr"]
    probe += ["--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64"]
    try:
        return subprocess.run([*probe, "--", "/usr/bin/true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


BWRAP = _bwrap_works()
needs_bwrap = pytest.mark.skipif(not BWRAP, reason="the test server runs pod commands in bubblewrap (unavailable)")

#: Image the test pods use; the test server runs commands on the host's /usr either way.
TEST_IMAGE = "registry.test/cwsandbox/python:3.11"


@pytest.fixture
async def k8s_server() -> AsyncIterator[KubeTestServer]:
    server = KubeTestServer()
    await server.start()
    yield server
    await server.stop()


BackendFactory = Callable[..., KubernetesBackend]


@pytest.fixture
async def make_backend(k8s_server: KubeTestServer) -> AsyncIterator[BackendFactory]:
    """Build backends against the test server; all are closed (and checked for leaked pods) afterwards."""
    made: list[KubernetesBackend] = []

    def make(**options: Any) -> KubernetesBackend:
        options.setdefault("server", k8s_server.url)
        options.setdefault("image", TEST_IMAGE)
        options.setdefault("namespace", "default")
        backend = KubernetesBackend(**options)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        await backend.aclose()


async def wait_no_pods(server: KubeTestServer, within: float = 5.0) -> None:
    """Wait until the server holds no pod at all (deleted pods linger ``termination_delay``)."""
    import anyio

    with anyio.move_on_after(within):
        while server.pods:  # noqa: ASYNC110 - polling another component's state in a test
            await anyio.sleep(0.02)
    assert server.live_pods() == [], "pods left behind"


async def wait_for(predicate: Callable[[], bool], within: float = 5.0) -> None:
    import anyio

    with anyio.move_on_after(within):
        while not predicate():  # noqa: ASYNC110 - polling another component's state in a test
            await anyio.sleep(0.02)
    assert predicate()
