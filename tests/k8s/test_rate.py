"""The client never floods the API server: a token bucket, an in-flight cap, a deadline on every call."""

from __future__ import annotations

import time

import anyio

from cwsandbox_async import SandboxStatus

from .conftest import BackendFactory
from .server import KubeTestServer


async def test_token_bucket_bounds_the_request_rate(k8s_server: KubeTestServer, make_backend: BackendFactory) -> None:
    qps, burst, n = 20.0, 5, 40
    backend = make_backend(qps=qps, burst=burst)
    start = time.monotonic()
    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(backend.status, f"sbx-{i:012d}")
    elapsed = time.monotonic() - start
    times = sorted(r.t for r in k8s_server.calls("GET"))
    assert len(times) == n
    assert elapsed >= (n - burst) / qps * 0.9  # a lower bound: a slow machine only makes it slower
    # In every 1 s window, at most burst + rate * (1 s + jitter) arrivals: sends are paced exactly, arrivals
    # may bunch up by the network delay (allowed up to 0.25 s here, generously).
    for i, t in enumerate(times):
        in_window = sum(1 for u in times[i:] if u - t <= 1.0)
        assert in_window <= burst + qps * 1.25 + 1


async def test_in_flight_cap(k8s_server: KubeTestServer, make_backend: BackendFactory) -> None:
    k8s_server.add_fault("slow", method="GET", seconds=0.1, times=100)
    backend = make_backend(max_in_flight=3, qps=1000, burst=1000)
    async with anyio.create_task_group() as tg:
        for i in range(15):
            tg.start_soon(backend.status, f"sbx-{i:012d}")
    assert k8s_server.max_in_flight <= 3
    assert len(k8s_server.calls("GET")) == 15


async def test_status_of_an_unknown_pod_is_failed(make_backend: BackendFactory) -> None:
    assert await make_backend().status("sbx-000000000000") is SandboxStatus.FAILED
