"""A pool of pods on the real control plane (tests/cluster): warm-up, leases at rollout rate, the apiserver's cost.

The cluster (etcd, kube-apiserver, controller-manager, scheduler and ``nodes`` bubblewrap
nodes) is started for the run and stopped after it. The backend runs as a ServiceAccount
bound to the Role of docs/kubernetes.md (TokenRequest token), as a user's would. A
``SandboxPool`` of ``size`` pods (fresh pod per lease) is warmed, then ``concurrency``
rollouts at a time lease a pod (with a hold timeout, so each lease sets the pod's
deadline), run ``true`` in it and give it back, for ``seconds``; every lease destroys its
pod and the pool creates a replacement.

The referee is the apiserver itself: ``apiserver_request_total`` from ``/metrics`` before
and after the lease window, by verb/resource/subresource/code (the scheduler's bindings,
the node's status patches and its final deletes are in there too, listed apart), the
apiserver's CPU from ``/proc/<pid>/stat``, its 429s, and the open pod watches
(``apiserver_longrunning_requests``) with the session running against before it started.
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio

import cwsandbox_async as cwa

from ._test_tree import use_test_tree

ROOT = Path(__file__).resolve().parent.parent
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\}\s+(\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
Key = tuple[str, str, str, str]  # verb, resource, subresource, code


def parse_metrics(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """The samples of metric ``name`` in Prometheus text format: (labels, value)."""
    out = []
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and m.group(1) == name:
            out.append((dict(_LABEL.findall(m.group(2))), float(m.group(3))))
    return out


def requests_by_kind(text: str) -> Counter[Key]:
    counts: Counter[Key] = Counter()
    for labels, value in parse_metrics(text, "apiserver_request_total"):
        key = (
            labels.get("verb", ""),
            labels.get("resource", ""),
            labels.get("subresource", ""),
            labels.get("code", ""),
        )
        counts[key] += int(value)
    return counts


def pod_watches(text: str) -> int:
    return int(
        sum(
            v
            for labels, v in parse_metrics(text, "apiserver_longrunning_requests")
            if labels.get("verb") == "WATCH" and labels.get("resource") == "pods"
        )
    )


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (all its threads), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


#: Who makes each kind of pod request (besides the backend): what the per-lifecycle table says.
MADE_BY = {
    ("POST", "pods", ""): "backend: create",
    ("PATCH", "pods", ""): "backend: lease deadline",
    ("CONNECT", "pods", "exec"): "backend: exec",
    ("GET", "pods", "exec"): "backend: exec",
    ("DELETE", "pods", ""): "backend: destroy; node: final delete",
    ("GET", "pods", ""): "backend (rare), node",
    ("LIST", "pods", ""): "watch relists (backend, informers)",
    ("WATCH", "pods", ""): "watch renewals (backend, informers)",
    ("POST", "pods", "binding"): "scheduler",
    ("PATCH", "pods", "status"): "node",
    ("PUT", "pods", "status"): "node",
}


async def _metrics(cluster: Any) -> str:
    return str(await anyio.to_thread.run_sync(lambda: cluster.api_text("/metrics")))


async def lease_window(
    backend: Any, *, size: int, concurrency: int, seconds: float, probe: Any = None
) -> dict[str, Any]:
    """Warm a fresh-per-lease pool of ``size``, then lease at rollout rate for ``seconds``. ``probe()`` (async,
    optional) is awaited at the window's start and end and every 10 s within it; what it returns is kept."""
    start = time.monotonic()
    samples: list[Any] = []
    session = cwa.Session({"max_lifetime_seconds": 3600}, backend=backend, handle_signals=False)
    async with session:
        pool = cwa.SandboxPool(
            session, size=size, max_size=size + concurrency, lease_timeout_seconds=600, lifetime_margin_seconds=60
        )
        async with pool:
            await pool.wait_ready(timeout_seconds=1800)
            warm_up = time.monotonic() - start
            client = backend.client
            calls0, statuses0 = Counter(client.calls), Counter(client.statuses)
            first = await probe() if probe else None
            t0 = time.monotonic()
            leases = failed = 0

            async def worker(end: float) -> None:
                nonlocal leases, failed
                while time.monotonic() < end:
                    try:
                        async with pool.lease(hold_timeout_seconds=300) as sb:
                            ok = (await sb.exec(["true"])).returncode == 0
                    except cwa.SandboxError:
                        ok = False
                    leases += 1
                    failed += not ok

            async def sample(end: float) -> None:
                while time.monotonic() + 10 < end:
                    await anyio.sleep(10)
                    samples.append(await probe())

            end = t0 + seconds
            async with anyio.create_task_group() as tg:
                if probe:
                    tg.start_soon(sample, end)
                for _ in range(concurrency):
                    tg.start_soon(worker, end)
            elapsed = time.monotonic() - t0
            last = await probe() if probe else None
            stats = pool.statistics()
            calls = client.calls - calls0
            statuses = client.statuses - statuses0
    watch = backend.watch
    return {
        "warm_up_s": round(warm_up, 1),
        "leases": leases,
        "failed": failed,
        "elapsed_s": round(elapsed, 1),
        "leases_per_s": round(leases / elapsed, 2),
        "backend_calls_per_lease": {k: round(v / max(1, leases), 3) for k, v in sorted(calls.items())},
        "backend_calls_per_lease_total": round(sum(calls.values()) / max(1, leases), 3),
        "client_429s": statuses.get(429, 0),
        "client_error_statuses": dict(statuses),
        "backend_watch_requests": watch.watches,
        "backend_watch_relists": watch.relists,
        "pool": {
            "created": stats.created,
            "destroyed": stats.destroyed,
            "warm_hit_rate": None if stats.warm_hit_rate is None else round(stats.warm_hit_rate, 3),
            "create_limit": stats.create_limit,
            "create_latency_ms": None
            if stats.create_latency_seconds is None
            else round(stats.create_latency_seconds * 1e3),
            "failures": stats.failures,
        },
        "_probes": (first, samples, last),
    }


def tenant_factory() -> Any:
    """``tests/k8s/real.py``'s ``tenant`` (not imported as ``tests.k8s``: a dependency's top-level
    ``tests`` package would win, see ``_test_tree``)."""
    use_test_tree()
    from k8s.real import tenant

    return tenant


async def pool_run(cluster: Any, *, size: int, concurrency: int, seconds: float, nodes: int) -> dict[str, Any]:
    tenant = tenant_factory()
    api_pid = next(c.pid for c in cluster.components if c.name == "kube-apiserver")

    async def probe() -> tuple[str, float]:
        return await _metrics(cluster), cpu_seconds(api_pid)

    async with tenant(cluster) as t:
        backend = t.backend(qps=200, burst=400, max_in_flight=64)
        before_session = pod_watches(await _metrics(cluster))
        out = await lease_window(backend, size=size, concurrency=concurrency, seconds=seconds, probe=probe)
        close_start = time.monotonic()
        await t.wait_no_pods(within=600)
        emptied = time.monotonic() - close_start
        left_on_nodes = {n: s.get("pods") for n, s in (await anyio.to_thread.run_sync(cluster.node_stats)).items()}
    (text0, cpu0), samples, (text1, cpu1) = out.pop("_probes")
    leases = max(1, out["leases"])
    server = requests_by_kind(text1) - requests_by_kind(text0)
    per_kind: dict[str, float] = {}
    for (verb, resource, sub, _code), n in sorted(server.items()):
        if resource == "pods":
            k = f"{verb} pods{'/' + sub if sub else ''}"
            per_kind[k] = per_kind.get(k, 0) + n / leases
    made_by = {f"{v} pods{'/' + s if s else ''}": who for (v, _r, s), who in MADE_BY.items()}
    only_backend = sum(
        per_kind.get(k, 0.0) for k, who in made_by.items() if who.startswith("backend:") and "node" not in who
    )
    cpu = cpu1 - cpu0
    out.update(
        {
            "config": {"pool_size": size, "concurrency": concurrency, "lease_seconds": seconds, "nodes": nodes},
            "apiserver_pod_requests_per_lease": {k: round(v, 3) for k, v in per_kind.items()},
            "apiserver_requests_per_lease_only_the_backend_makes": round(only_backend, 3),
            "apiserver_delete_pods_per_lease": round(per_kind.get("DELETE pods", 0.0), 3),
            "made_by": made_by,
            "apiserver_cpu_ms_per_lease": round(1000 * cpu / leases, 2),
            "apiserver_cpu_cores_busy": round(cpu / out["elapsed_s"], 2),
            "apiserver_429s": sum(n for (_v, _r, _s, code), n in server.items() if code == "429"),
            "pod_watches_open_before_session": before_session,
            "pod_watches_open_during_session": sorted({pod_watches(text) for text, _ in samples}),
            "after_close": {"pods_gone_after_s": round(emptied, 1), "pods_on_nodes": left_on_nodes},
        }
    )
    return out


async def run(*, size: int, concurrency: int, seconds: float, nodes: int) -> dict[str, Any]:
    """Start a cluster with ``nodes`` nodes, run the pool on it, stop it (on every exit path)."""
    use_test_tree()
    from cluster.build import locate
    from cluster.cluster import Cluster

    names = tuple((f"node-{i}", i % 2 == 0) for i in range(1, nodes + 1))  # half pass WebSocket exec through
    cluster = Cluster(locate(), nodes=names, die_with_parent=True)
    await anyio.to_thread.run_sync(lambda: cluster.start(timeout=300))
    try:
        version = cluster.api_get("/version")["gitVersion"]
        out = await pool_run(cluster, size=size, concurrency=concurrency, seconds=seconds, nodes=nodes)
        out["apiserver_version"] = version
        return out
    finally:
        await anyio.to_thread.run_sync(cluster.stop)
