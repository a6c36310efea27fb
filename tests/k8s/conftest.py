"""Fixtures: a fresh Kubernetes API test server per test, and backends pointed at it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from guards import HANG_GUARD_SECONDS, LONG_SECONDS

from cwsandbox_async.backends.kubernetes import KubernetesBackend

from .container import bwrap_path
from .server import KubeTestServer


def _bwrap_works() -> bool:
    """bwrap may create the user and PID namespaces the test server's containers use, and nsenter join them."""
    import shutil
    import subprocess
    import time
    from pathlib import Path

    path = bwrap_path()
    if path is None or shutil.which("nsenter") is None:
        return False
    probe = [path, "--unshare-user", "--unshare-pid", "--as-pid-1", "--die-with-parent", "--ro-bind", "/usr", "/usr"]
    probe += ["--proc", "/proc", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib"]
    probe += ["--symlink", "usr/lib64", "/lib64", "--", "/bin/sleep", str(LONG_SECONDS)]  # killed below
    try:
        with subprocess.Popen(probe, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as outer:
            try:
                children = ""
                deadline = time.monotonic() + HANG_GUARD_SECONDS  # bwrap forks slowly on a loaded machine
                while time.monotonic() < deadline:
                    children = Path(f"/proc/{outer.pid}/task/{outer.pid}/children").read_text().strip()
                    if outer.poll() is not None:
                        break
                    if (
                        children
                        and Path(f"/proc/{children.split()[0]}/cmdline").read_bytes()
                        == b"/bin/sleep\x00%d\x00" % LONG_SECONDS
                    ):
                        break  # PID 1 is set up (namespaces, mounts) and runs its command
                    time.sleep(0.01)
                if not children:
                    return False
                join = ["nsenter", "-t", children.split()[0], "-U", "-m", "-p", "--preserve-credentials", "-r", "-w"]
                joined = subprocess.run([*join, "--", "/bin/true"], capture_output=True, timeout=HANG_GUARD_SECONDS)
                return joined.returncode == 0
            finally:
                outer.kill()
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


async def wait_no_pods(server: KubeTestServer, within: float = HANG_GUARD_SECONDS) -> None:
    """Wait until the server holds no pod at all (deleted pods linger ``termination_delay``)."""
    import anyio

    with anyio.move_on_after(within):
        while server.pods:  # noqa: ASYNC110 - polling another component's state in a test
            await anyio.sleep(0.02)
    assert server.live_pods() == [], "pods left behind"


async def wait_for(predicate: Callable[[], bool], within: float = HANG_GUARD_SECONDS) -> None:
    import anyio

    with anyio.move_on_after(within):
        while not predicate():  # noqa: ASYNC110 - polling another component's state in a test
            await anyio.sleep(0.02)
    assert predicate()
