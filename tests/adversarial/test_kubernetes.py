"""The adversarial cases that concern the Kubernetes client, against the test API server.

The test server runs pod commands in bubblewrap on this host; it is a test double,
not an isolation boundary, so only what the *client* must withstand is tested here:
output floods over the exec WebSocket, timeouts that a command tries to ignore,
and bytes that are not UTF-8. Isolation inside a real pod is the cluster's (see
SECURITY.md and ``tests/k8s/test_manifest.py`` for the hardened pod spec).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest
from guards import HANG_GUARD_SECONDS

# The test API server's fixtures live with its tests; importing them here makes them usable.
from k8s.conftest import BackendFactory, k8s_server, make_backend, needs_bwrap, wait_no_pods  # noqa: F401
from k8s.server import KubeTestServer

import cwsandbox_async as cwa

pytestmark = needs_bwrap


@pytest.fixture
async def pod(make_backend: BackendFactory, k8s_server: KubeTestServer) -> AsyncIterator[cwa.Sandbox]:  # noqa: F811
    async with cwa.Session(backend=make_backend(), handle_signals=False) as s:
        yield await s.sandbox()
    await wait_no_pods(k8s_server)


async def test_a_gigabyte_flood_over_the_exec_socket_is_cut_at_the_cap(pod: cwa.Sandbox) -> None:
    cap = 4 << 20
    with anyio.fail_after(HANG_GUARD_SECONDS):
        r = await pod.exec(
            "head -c 1073741824 /dev/zero & head -c 1073741824 /dev/zero >&2; wait; echo flood done >&2",
            max_output_bytes=cap,
            timeout_seconds=HANG_GUARD_SECONDS,
        )
    assert r.truncated and len(r.stdout_bytes) <= cap and len(r.stderr_bytes) <= cap
    assert max(len(r.stdout_bytes), len(r.stderr_bytes)) == cap
    # Ended at the cap, not left to write its two gigabytes to the end (nor cut by its deadline).
    assert not r.timed_out and "flood done" not in r.stderr
    assert (await pod.exec(["echo", "alive"])).stdout == "alive\n"


async def test_a_command_ignoring_sigterm_still_ends_at_its_timeout(pod: cwa.Sandbox) -> None:
    # Were TERM all it got, it would run for 2,000 s: ending inside the hang guard is the fact.
    with anyio.fail_after(HANG_GUARD_SECONDS), pytest.raises(cwa.SandboxTimeoutError) as info:
        await pod.exec("trap '' TERM; echo ready; sleep 1000 & wait; sleep 1000", timeout_seconds=1)
    assert info.value.infrastructure is False and info.value.result is not None
    assert info.value.result.stdout == "ready\n"


async def test_invalid_utf8_and_nul_bytes_arrive_byte_exact(pod: cwa.Sandbox) -> None:
    blob = bytes(range(256)) * 512 + b"\xff\xfe\x00\xc3\x28"
    r = await pod.exec(["cat"], stdin=blob)
    assert r.stdout_bytes == blob and "\ufffd" in r.stdout
    await pod.write_file("/workspace/blob", blob)
    assert await pod.read_file("/workspace/blob") == blob
