"""bench_scale, part 2: the orchestration's CPU cost with N simulated sandboxes (see ``bench_scale``)."""

from __future__ import annotations

import asyncio
import functools
import gc
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from typing import Any

import cwsandbox_async as cwa
from cwsandbox_async._types import ExecRequest, SandboxDefaults, SandboxSpec
from cwsandbox_async.testing import FakeBackend

#: Items in flight at once (gather limit, bare-task semaphore).
LIMIT = 256
#: Warm sandboxes in the pool.
POOL_SIZE = 256
REPEATS = 2


def us(seconds: float, n: int) -> float:
    return round(seconds / max(n, 1) * 1e6, 2)


REQUEST = ExecRequest(argv=("true",), cwd="/workspace", env={}, stdin=None, timeout_seconds=60.0,
                      max_output_bytes=1 << 24)  # fmt: skip


async def workers(items: list[SandboxSpec], call: Callable[[SandboxSpec], Awaitable[Any]]) -> float:
    """CPU seconds for ``LIMIT`` bare asyncio tasks to make ``call`` once per item (no library)."""
    it = iter(items)

    async def worker() -> None:
        for spec in it:
            await call(spec)

    cpu = time.process_time()
    await asyncio.gather(*[worker() for _ in range(LIMIT)])
    return time.process_time() - cpu


def specs(n: int) -> list[SandboxSpec]:
    defaults = SandboxDefaults()
    return [SandboxSpec(sandbox_id=f"sbx-{i:08x}", session_id="bare", defaults=defaults) for i in range(n)]


async def bare(n: int) -> dict[str, float]:
    """Baseline: the same backend calls, phase by phase with all N alive, from bare asyncio tasks."""
    backend = FakeBackend()
    items = specs(n)
    create = await workers(items, backend.create)
    execs = await workers(items, lambda s: backend.exec(s.sandbox_id, REQUEST))
    destroy = await workers(items, lambda s: backend.destroy(s.sandbox_id))
    assert backend.created == n and backend.destroyed == n and backend.live == 0
    return {"create_us": us(create, n), "exec_us": us(execs, n), "destroy_us": us(destroy, n)}


async def bare_cycle(n: int) -> dict[str, float]:
    """Baseline for a fresh lease: create, exec, destroy one sandbox per item from bare asyncio tasks."""
    backend = FakeBackend()

    async def cycle(spec: SandboxSpec) -> None:
        await backend.create(spec)
        await backend.exec(spec.sandbox_id, REQUEST)
        await backend.destroy(spec.sandbox_id)

    cpu = await workers(specs(n), cycle)
    assert backend.destroyed == n
    return {"cycle_us": us(cpu, n)}


async def lifecycle(n: int) -> dict[str, float]:
    """Session + gather: create N (all alive at once), one exec in each, stop each."""
    backend = FakeBackend()
    async with cwa.Session(backend=backend, handle_signals=False) as session:
        cpu = time.process_time()
        created = await cwa.gather([session.create_sandbox] * n, limit=LIMIT, metrics=session.metrics, progress=False)
        create = time.process_time() - cpu
        sandboxes = [o.value for o in created if o.ok and o.value is not None]
        assert len(sandboxes) == n and backend.live == n, created[:3]
        work: list[Callable[[], Awaitable[Any]]] = [functools.partial(sb.exec, ["true"]) for sb in sandboxes]
        cpu = time.process_time()
        execs = await cwa.gather(work, limit=LIMIT, metrics=session.metrics, progress=False)
        exec_cpu = time.process_time() - cpu
        assert all(o.ok for o in execs), [o for o in execs if not o.ok][:3]
        cpu = time.process_time()
        stops = await cwa.gather([sb.stop for sb in sandboxes], limit=LIMIT, progress=False)
        destroy = time.process_time() - cpu
        assert all(o.ok for o in stops) and backend.live == 0
    return {
        "create_us": us(create, n),
        "exec_us": us(exec_cpu, n),
        "destroy_us": us(destroy, n),
    }


async def driver_bytes(n: int) -> float:
    """Bytes the driver allocates per live sandbox (tracemalloc; Sandbox handle, session and metrics state)."""
    async with cwa.Session(backend=FakeBackend(), handle_signals=False) as session:
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            created = await cwa.gather([session.create_sandbox] * n, limit=LIMIT, progress=False)
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert all(o.ok for o in created)
        del created
    return grown / n


async def pool(n: int) -> dict[str, float]:
    """N leases of a fresh sandbox each (create + exec + destroy) from a warm pool, through gather."""
    backend = FakeBackend()
    async with (
        cwa.Session(backend=backend, handle_signals=False) as session,
        cwa.SandboxPool(session, size=POOL_SIZE, reuse=False) as sandbox_pool,
    ):
        await sandbox_pool.wait_ready()

        async def rollout() -> cwa.ExecResult:
            async with sandbox_pool.lease() as sb:
                result = await sb.exec(["true"])
            return result

        cpu = time.process_time()
        wall = time.perf_counter()
        outcomes = await cwa.gather((rollout for _ in range(n)), limit=LIMIT, metrics=session.metrics, progress=False)
        wall = time.perf_counter() - wall
        lease_cpu = time.process_time() - cpu
        assert len(outcomes) == n and all(o.ok for o in outcomes), [o for o in outcomes if not o.ok][:3]
    return {"lease_us": us(lease_cpu, n), "leases_per_s": round(n / wall), "created": backend.created}


async def fake_scale(n: int) -> dict[str, Any]:
    print(f"FakeBackend, zero latency: {n:,} sandboxes, {LIMIT} in flight, best of {REPEATS}", flush=True)
    runs: dict[str, list[dict[str, float]]] = {"bare": [], "lifecycle": [], "bare_cycle": [], "pool": []}
    for _ in range(REPEATS):
        for name, fn in (("bare", bare), ("lifecycle", lifecycle), ("bare_cycle", bare_cycle), ("pool", pool)):
            gc.collect()
            runs[name].append(await fn(n))
    best = {name: {k: min(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}
    per_sandbox = await driver_bytes(n)
    b, lib, lease = best["bare"], best["lifecycle"], best["pool"]
    cycle = best["bare_cycle"]["cycle_us"]
    out: dict[str, Any] = {
        "n": n,
        "limit": LIMIT,
        "pool_size": POOL_SIZE,
        "cpu_us_per_op": best,
        "library_us_over_bare": {
            "create": round(lib["create_us"] - b["create_us"], 2),
            "exec": round(lib["exec_us"] - b["exec_us"], 2),
            "destroy": round(lib["destroy_us"] - b["destroy_us"], 2),
            "lease": round(lease["lease_us"] - cycle, 2),
        },
        "driver_bytes_per_live_sandbox": round(per_sandbox),
        "ratios": {
            "create_vs_bare": round(lib["create_us"] / b["create_us"], 2),
            "exec_vs_bare": round(lib["exec_us"] / b["exec_us"], 2),
            "destroy_vs_bare": round(lib["destroy_us"] / b["destroy_us"], 2),
            "pool_lease_vs_bare_cycle": round(lease["lease_us"] / cycle, 2),
        },
    }
    over = out["library_us_over_bare"]
    for label in ("create", "exec", "destroy"):
        print(
            f"  {label:<8} {lib[label + '_us']:8.1f} us CPU (Session + gather) vs {b[label + '_us']:7.1f} us bare "
            f"backend call: library {over[label]:+.1f} us",
            flush=True,
        )
    print(
        f"  lease    {lease['lease_us']:8.1f} us CPU (pool, fresh sandbox: create + exec + destroy) vs "
        f"{cycle:7.1f} us bare: library {over['lease']:+.1f} us; {lease['leases_per_s']:,.0f} leases/s",
        flush=True,
    )
    print(f"  driver memory per live sandbox handle: {per_sandbox / 1024:.2f} KiB (tracemalloc)", flush=True)
    out["headline"] = {
        "sim sandboxes": n,
        "sim CPU us/create": lib["create_us"],
        "sim CPU us/exec": lib["exec_us"],
        "sim CPU us/destroy": lib["destroy_us"],
        "sim CPU us/lease (fresh)": lease["lease_us"],
        "sim lease vs bare create+exec+destroy": out["ratios"]["pool_lease_vs_bare_cycle"],
        "sim driver KiB/live sandbox": round(per_sandbox / 1024, 2),
    }
    return out
