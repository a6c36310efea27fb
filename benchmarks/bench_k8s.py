"""The Kubernetes backend against the test API server: API calls per sandbox lifecycle, exec round trip.

The test server (tests/k8s/server.py) runs in its own process on 127.0.0.1; pods
become Ready ``--ready-delay`` seconds after creation (default 0.8 s, the create->Ready
time measured on EKS with a cached image, kubernetes.md section 5), and exec runs
real processes in bubblewrap.

1. API calls per sandbox lifecycle (create, ready, exec, write, read, destroy), counted
   by the client (every attempt, retries included) for N sandboxes created at once,
   against a baseline measured in the same run: the same lifecycle with readiness
   found by polling each pod (GET every 0.2 s) instead of the shared watch.
2. Exec round trip of ``true`` (p50/p99, sequential; and throughput with 16 at once),
   against a baseline: spawning the same bubblewrap sandbox for ``true`` directly from
   this process (what the test server's "kubelet" does per exec, minus the API,
   WebSocket and wrapper script).

Writes benchmarks/out/k8s.json.

    python -m benchmarks.bench_k8s [--quick]

With ``--pool``: a fresh-per-lease ``SandboxPool`` of ``--size`` pods warmed, then leased
``--concurrency`` at a time for ``--seconds`` (``_k8s_real``), against the test server and
against the real control plane of tests/cluster (``--nodes`` nodes; the binaries must be
built: ``make build-cluster``), measured by the apiserver's own ``/metrics`` and
``/proc/<pid>/stat``. Writes benchmarks/out/k8s_pool.json.

    python -m benchmarks.bench_k8s --pool --size 500 --concurrency 32 --seconds 180 --nodes 4
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio

from cwsandbox_async.backends.kubernetes import KubernetesBackend
from cwsandbox_async.backends.kubernetes._exec import stream_exec
from cwsandbox_async.backends.kubernetes._inventory import pods_path
from cwsandbox_async.backends.kubernetes._manifest import build_pod
from cwsandbox_async.backends.kubernetes._podstate import view
from cwsandbox_async.testing.contract import make_request, make_spec

from ._common import parse_args, summary, write_json
from ._test_tree import TESTS, use_test_tree

ROOT = Path(__file__).resolve().parent.parent
IMAGE = "registry.test/bench:1"
POLL_INTERVAL = 0.2


def start_server(ready_delay: float) -> tuple[subprocess.Popen[str], str]:
    code = f"import sys; sys.path.insert(0, {str(TESTS)!r}); from k8s.server import main; main()"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "--ready-delay", str(ready_delay)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    if not url.startswith("http"):
        proc.kill()
        raise SystemExit("the test server did not start")
    return proc, url


def delta(after: Counter[str], before: Counter[str]) -> int:
    return sum((after - before).values())


async def lifecycle_with_watch(url: str, n: int) -> dict[str, float]:
    """API calls per sandbox for each phase, readiness from the shared watch."""
    backend = KubernetesBackend(server=url, image=IMAGE, qps=1000, burst=1000)
    specs = [make_spec("bench") for _ in range(n)]
    phases: dict[str, float] = {}
    try:
        await backend.list(["warmup"])  # configuration and connection set-up, not counted
        assert backend.client is not None
        calls = backend.client.calls
        mark = Counter(calls)

        def phase(name: str) -> None:
            nonlocal mark
            phases[name] = delta(calls, mark) / n
            mark = Counter(calls)

        async def each(fn: Any) -> None:
            async with anyio.create_task_group() as tg:
                for s in specs:
                    tg.start_soon(fn, s.sandbox_id)

        async with anyio.create_task_group() as tg:
            for s in specs:
                tg.start_soon(backend.create, s)
        phase("create+ready")
        await each(lambda sid: backend.exec(sid, make_request("true")))
        phase("exec")
        await each(lambda sid: backend.write_file(sid, "/workspace/f.txt", b"x" * 1000))
        phase("write")
        await each(lambda sid: backend.read_file(sid, "/workspace/f.txt", 4096))
        phase("read")
        await each(backend.destroy)
        phase("destroy")
    finally:
        await backend.aclose()
    phases["close (amortised)"] = delta(calls, mark) / n
    phases["total"] = sum(phases.values())
    return phases


async def lifecycle_with_polling(url: str, n: int) -> dict[str, float]:
    """The baseline: the same pods, readiness by GET every POLL_INTERVAL seconds per pod."""
    backend = KubernetesBackend(server=url, image=IMAGE, qps=1000, burst=1000, sweep_on_close=False)
    await backend.list(["warmup"])
    client = backend.client
    assert client is not None and backend.namespace is not None
    ns = backend.namespace
    before = Counter(client.calls)
    polls = 0

    async def one() -> None:
        nonlocal polls
        spec = make_spec("bench-poll")
        pod = build_pod(spec, backend.options, namespace=ns, driver="poller")
        await client.request("POST", pods_path(ns), body=pod)
        while True:
            await anyio.sleep(POLL_INTERVAL)
            polls += 1
            obj = await client.request("GET", f"{pods_path(ns)}/{spec.sandbox_id}")
            if view(spec.sandbox_id, obj).ready:
                break
        await backend.exec(spec.sandbox_id, make_request("true"))
        await backend.write_file(spec.sandbox_id, "/workspace/f.txt", b"x" * 1000)
        await backend.read_file(spec.sandbox_id, "/workspace/f.txt", 4096)
        await backend.destroy(spec.sandbox_id)

    try:
        async with anyio.create_task_group() as tg:
            for _ in range(n):
                tg.start_soon(one)
        total = delta(client.calls, before) / n
    finally:
        await backend.aclose()
    return {"create+ready": 1 + polls / n, "total": total}


async def exec_rtt(url: str, samples: int) -> dict[str, Any]:
    backend = KubernetesBackend(server=url, image=IMAGE, qps=10_000, burst=10_000)
    spec = make_spec("bench-exec")
    try:
        await backend.create(spec)
        sid = spec.sandbox_id
        for _ in range(5):
            await backend.exec(sid, make_request("true"))
        times, bare = [], []
        assert backend.client is not None and backend.namespace is not None
        client, ns = backend.client, backend.namespace
        for _ in range(samples):  # interleaved, so both see the same load
            start = time.perf_counter()
            r = await backend.exec(sid, make_request("true"))
            times.append(time.perf_counter() - start)
            assert r.returncode == 0
            start = time.perf_counter()  # the same exec without the in-pod wrapper (session, timeout, env)
            await stream_exec(
                client, ns, sid, ["true"], container="main", stdin=b"", deadline_seconds=30,
                connect_timeout=10, drain_seconds=1, on_abandon=lambda ab: None,
            )  # fmt: skip
            bare.append(time.perf_counter() - start)
        limiter = anyio.CapacityLimiter(16)

        async def limited() -> None:
            async with limiter:
                await backend.exec(sid, make_request("true"))

        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(samples):
                tg.start_soon(limited)
        concurrent = samples / (time.perf_counter() - start)
        await backend.destroy(sid)
    finally:
        await backend.aclose()
    return {"sequential_s": summary(times), "unwrapped_s": summary(bare), "throughput_per_s_16": concurrent}


async def bare_spawn(samples: int) -> dict[str, float]:
    """Baseline: entering the test server's pod container directly (what it does per exec), no API, no wrapper."""
    import tempfile

    use_test_tree()
    from k8s.container import Container

    with tempfile.TemporaryDirectory() as tmp:
        pod = build_pod(make_spec("bare"), KubernetesBackend(image=IMAGE).options, namespace="default", driver="x")
        container = Container(pod, Path(tmp))
        await container.start()
        times = []
        try:
            for i in range(samples + 5):
                start = time.perf_counter()
                proc = await container.exec(["true"], stdin=False)
                await proc.wait()
                container.execs.discard(proc)
                if i >= 5:
                    times.append(time.perf_counter() - start)
        finally:
            await container.stop()
    return summary(times)


async def run(quick: bool, ready_delay: float) -> dict[str, Any]:
    n = 10 if quick else 50
    samples = 50 if quick else 300
    proc, url = start_server(ready_delay)
    try:
        watch = await lifecycle_with_watch(url, n)
        poll = await lifecycle_with_polling(url, n)
        rtt = await exec_rtt(url, samples)
    finally:
        proc.terminate()
        proc.wait(10)
    bare = await bare_spawn(samples)
    p50, bare50 = rtt["sequential_s"]["p50"], bare["p50"]
    return {
        "config": {
            "sandboxes": n,
            "exec_samples": samples,
            "ready_delay_s": ready_delay,
            "poll_interval_s": POLL_INTERVAL,
        },
        "api_calls_per_sandbox": watch,
        "baseline_poll_api_calls_per_sandbox": poll,
        "exec_rtt": rtt,
        "baseline_bare_bwrap_spawn_s": bare,
        "headline": {
            "api_calls_per_lifecycle": round(watch["total"], 2),
            "poll_baseline_api_calls_per_lifecycle": round(poll["total"], 2),
            "api_calls_ratio_watch_vs_poll": round(watch["total"] / poll["total"], 3),
            "exec_rtt_p50_ms": round(p50 * 1000, 2),
            "exec_rtt_p99_ms": round(rtt["sequential_s"]["p99"] * 1000, 2),
            "exec_rtt_ratio_vs_bare_spawn": round(p50 / bare50, 2),
            "exec_rtt_ratio_vs_unwrapped_exec": round(p50 / rtt["unwrapped_s"]["p50"], 2),
            "exec_throughput_per_s": round(rtt["throughput_per_s_16"], 1),
        },
    }


async def pool_test_server(size: int, concurrency: int, seconds: float) -> dict[str, Any]:
    """The same pool run against the test server (readiness 0.8 s after creation, as in ``run``)."""
    from ._k8s_real import lease_window

    proc, url = start_server(0.8)
    try:
        backend = KubernetesBackend(server=url, image=IMAGE, qps=200, burst=400, max_in_flight=64)
        out = await lease_window(backend, size=size, concurrency=concurrency, seconds=seconds)
        out.pop("_probes")
        return out
    finally:
        proc.terminate()
        proc.wait(10)


async def pool(args: argparse.Namespace) -> dict[str, Any]:
    from . import _k8s_real

    real = None
    if not args.test_server_only:
        real = await _k8s_real.run(size=args.size, concurrency=args.concurrency, seconds=args.seconds, nodes=args.nodes)
    fake = await pool_test_server(args.size, args.concurrency, args.seconds) if not args.real_only else None
    return {"real_apiserver": real, "test_server": fake}


def main() -> None:
    if "--pool" in sys.argv:
        parser = argparse.ArgumentParser(description="a pool of pods on the real control plane and the test server")
        parser.add_argument("--pool", action="store_true")
        parser.add_argument("--size", type=int, default=500)
        parser.add_argument("--concurrency", type=int, default=32)
        parser.add_argument("--seconds", type=float, default=180.0)
        parser.add_argument("--nodes", type=int, default=4)
        parser.add_argument("--real-only", action="store_true", help="skip the test-server run")
        parser.add_argument("--test-server-only", action="store_true", help="skip the real control plane")
        args = parser.parse_args()
        out = anyio.run(pool, args)
        name = "k8s_pool_test_server" if args.test_server_only else "k8s_pool_real" if args.real_only else "k8s_pool"
        path = write_json(name, {"args": vars(args), **out})
        for name, r in out.items():
            if r is not None:
                print(name, {k: v for k, v in r.items() if k not in ("made_by", "pool")})
        print(f"wrote {path}")
        return
    args = parse_args(__doc__.splitlines()[0])
    result = anyio.run(run, args.quick, 0.8)
    path = write_json("k8s", {"quick": args.quick, **result})
    print("API calls per sandbox (shared watch):")
    for k, v in result["api_calls_per_sandbox"].items():
        print(f"  {k:<20} {v:6.2f}")
    print("baseline, poll per pod:", {k: round(v, 2) for k, v in result["baseline_poll_api_calls_per_sandbox"].items()})
    for k, v in result["headline"].items():
        print(f"{k:<45} {v}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
