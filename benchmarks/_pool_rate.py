"""Rollouts per second through a pool: a fresh sandbox per lease vs ``reuse=True``, the same pool otherwise.

Each rollout leases a sandbox and runs one workload in it (``true``, or a small Python
program through ``run_python``), ``concurrency`` at a time through ``cwa.gather``; the
pool is warmed to ``concurrency`` first. The fresh-per-lease pool (the safe default)
must create and destroy a sandbox per rollout; the reuse pool only execs. Their ratio
(fresh / reuse, measured in the same run) says what safety costs. A third row creates
a sandbox per rollout without a pool (``async with session.sandbox()``): what the fresh
pool must at least match, since both pay one create and one destroy per rollout. Also
recorded: the fresh pool's warm-hit rate (leases served at once), its create limit and
create latency.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import cwsandbox_async as cwa

Workload = Callable[[cwa.Sandbox], Awaitable[cwa.ExecResult]]

WORKLOADS: dict[str, Workload] = {
    "true": lambda sb: sb.exec(["true"]),
    "python": lambda sb: sb.run_python("print(sum(i * i for i in range(1000)))"),
}


async def run_rollouts(
    open_sandbox: Callable[[], AbstractAsyncContextManager[cwa.Sandbox]], workload: Workload, n: int, concurrency: int
) -> tuple[float, int]:
    """``n`` rollouts, ``concurrency`` at a time, each in a sandbox from ``open_sandbox()``: (rollouts/s, failed)."""

    def rollout() -> Callable[[], Awaitable[bool]]:
        async def run() -> bool:
            async with open_sandbox() as sb:
                return (await workload(sb)).ok

        return run

    start = time.perf_counter()
    outcomes = await cwa.gather({i: rollout() for i in range(n)}, limit=concurrency)
    elapsed = time.perf_counter() - start
    return round(n / elapsed, 1), sum(1 for o in outcomes if not (o.ok and o.value))


async def rollouts_per_second(
    backend: Any, *, reuse: bool, n: int, concurrency: int, workload: Workload
) -> dict[str, Any]:
    """Through a pool warmed to ``concurrency`` (fresh sandbox per lease, or ``reuse``)."""
    async with (
        cwa.Session(backend=backend) as session,
        cwa.SandboxPool(
            session, size=concurrency, max_size=2 * concurrency, reuse=reuse, lease_timeout_seconds=600
        ) as pool,
    ):
        await pool.wait_ready(timeout_seconds=600)
        rate, failed = await run_rollouts(pool.lease, workload, n, concurrency)
        stats = pool.statistics()
    latency = stats.create_latency_seconds
    return {
        "rollouts_per_s": rate,
        "failed": failed,
        "warm_hit_rate": None if stats.warm_hit_rate is None else round(stats.warm_hit_rate, 3),
        "create_limit": stats.create_limit,
        "create_latency_ms": None if latency is None else round(latency * 1e3, 1),
    }


async def without_pool(backend: Any, *, n: int, concurrency: int, workload: Workload) -> dict[str, Any]:
    """Rollouts that each create their own sandbox (no pool), ``concurrency`` at a time."""
    async with cwa.Session(backend=backend) as session:
        rate, failed = await run_rollouts(session.sandbox, workload, n, concurrency)
    return {"rollouts_per_s": rate, "failed": failed}


async def fresh_vs_reuse(backend: Any, *, n: int, concurrency: int) -> dict[str, Any]:
    """Per workload: the reuse pool, then the fresh pool, and fresh/reuse."""
    out: dict[str, Any] = {"rollouts": n, "concurrency": concurrency}
    for name, workload in WORKLOADS.items():
        reuse = await rollouts_per_second(backend, reuse=True, n=n, concurrency=concurrency, workload=workload)
        fresh = await rollouts_per_second(backend, reuse=False, n=n, concurrency=concurrency, workload=workload)
        bare = await without_pool(backend, n=n, concurrency=concurrency, workload=workload)
        out[name] = {
            "reuse": reuse,
            "fresh": fresh,
            "no_pool": bare,
            "ratio_fresh_to_reuse": round(fresh["rollouts_per_s"] / reuse["rollouts_per_s"], 2),
            "ratio_fresh_to_no_pool": round(fresh["rollouts_per_s"] / bare["rollouts_per_s"], 2),
        }
    return out


def table(result: dict[str, Any]) -> str:
    lines = [
        "| workload | reuse rollouts/s | fresh rollouts/s | fresh / reuse | no pool rollouts/s | fresh / no pool | "
        "fresh warm-hit rate | create limit | create ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in WORKLOADS:
        r = result[name]
        f = r["fresh"]
        lines.append(
            f"| {name} | {r['reuse']['rollouts_per_s']} | {f['rollouts_per_s']} | {r['ratio_fresh_to_reuse']}x | "
            f"{r['no_pool']['rollouts_per_s']} | {r['ratio_fresh_to_no_pool']}x | "
            f"{f['warm_hit_rate']} | {f['create_limit']} | {f['create_latency_ms']} |"
        )
    return "\n".join(lines)
