"""Pool burst: time to first exec with a warm SandboxPool vs creating a sandbox per rollout.

A GRPO step launches a burst of rollouts at once. Each rollout's *time to first exec*
is measured from the burst's start to the end of its first command:

- baseline, create per rollout (the pattern in the CoreWeave docs):
  ``async with session.sandbox() as sb: await sb.exec(["true"])``;
- warm pool: ``async with pool.lease() as sb: await sb.exec(["true"])`` on a pool
  warmed to the burst size beforehand (it warms while the trainer runs its optimizer step);
- variants: a pool warmed to a quarter of the burst (FakeBackend), and on the local
  backend a pool with a fixed ``create_concurrency`` of the burst size (refills not
  paced by measured capacity; local creation costs CPU on this machine and competes
  with the rollouts).

Also measured: warm lease latency (``lease().__aenter__`` on a warm pool, one at a time),
the lease wait inside the burst and each pool's warm-hit rate; and on the local backend
rollouts per second of a fresh-sandbox-per-lease pool against the same pool with
``reuse=True`` (``benchmarks/_pool_rate.py``).

Backends: FakeBackend with a Kubernetes-like startup (lognormal, median 1 s, p99 5 s;
``--quick`` scales it by 0.1) and an exec of 2 ms; the local backend when it can create a
sandbox here. Writes benchmarks/out/pool.json and benchmarks/out/pool.png.

    python -m benchmarks.bench_pool [--quick] [--no-local] [--rate-rollouts N] [--rate-concurrency N]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import anyio

import cwsandbox_async as cwa
from cwsandbox_async.testing import FakeBackend, Latency

from ._common import OUT_DIR, percentile, write_json
from ._pool_rate import fresh_vs_reuse, table

BURST = 256


def stats_ms(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50_ms": round(percentile(values, 50) * 1e3, 3),
        "p99_ms": round(percentile(values, 99) * 1e3, 3),
        "max_ms": round(max(values) * 1e3, 3) if values else float("nan"),
    }


async def burst_create_per_rollout(backend: Any, n: int) -> list[float]:
    """Each rollout creates its own sandbox, runs one command, stops it."""
    ttfe: list[float] = []
    async with cwa.Session(backend=backend) as session:
        start = time.perf_counter()

        async def rollout() -> None:
            async with session.sandbox() as sb:
                await sb.exec(["true"])
                ttfe.append(time.perf_counter() - start)

        async with anyio.create_task_group() as tg:
            for _ in range(n):
                tg.start_soon(rollout)
    return ttfe


async def burst_pool(backend: Any, n: int, **pool_kw: Any) -> dict[str, Any]:
    """Warm a pool (not timed: it warms while the trainer runs its optimizer step), then the burst leases."""
    ttfe: list[float] = []
    waits: list[float] = []
    async with (
        cwa.Session(backend=backend) as session,
        cwa.SandboxPool(session, lease_timeout_seconds=600, **pool_kw) as pool,
    ):
        t = time.perf_counter()
        await pool.wait_ready(timeout_seconds=600)
        warmup = time.perf_counter() - t
        start = time.perf_counter()

        async def rollout() -> None:
            t0 = time.perf_counter()
            async with pool.lease() as sb:
                waits.append(time.perf_counter() - t0)
                await sb.exec(["true"])
                ttfe.append(time.perf_counter() - start)

        async with anyio.create_task_group() as tg:
            for _ in range(n):
                tg.start_soon(rollout)
        stats = pool.statistics()
    return {
        "ttfe": ttfe,
        "lease_wait": waits,
        "warmup_seconds": round(warmup, 3),
        "warm_hits": stats.warm_hits,
        "cold_waits": stats.cold_waits,
        "warm_hit_rate": stats.warm_hit_rate,
        "max_alive": stats.max_alive,
    }


async def warm_lease_latency(backend: Any, n: int) -> list[float]:
    """``lease().__aenter__`` on a pool with ``n`` idle sandboxes, one lease at a time (all warm hits)."""
    latencies: list[float] = []
    async with cwa.Session(backend=backend) as session, cwa.SandboxPool(session, size=n, max_size=2 * n) as pool:
        await pool.wait_ready(timeout_seconds=600)
        for _ in range(n):
            lease = pool.lease()
            t0 = time.perf_counter()
            await lease.__aenter__()
            latencies.append(time.perf_counter() - t0)
            await lease.__aexit__(None, None, None)
        assert pool.statistics().warm_hits == n
    return latencies


def fake_backend(scale: float, seed: int) -> FakeBackend:
    return FakeBackend(
        seed=seed,
        create_latency=Latency.lognormal(median=1.0 * scale, p99=5.0 * scale),
        exec_latency=Latency.constant(0.002),
    )


async def scenario(make_backend: Any, n: int, pools: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The create-per-rollout baseline, then one burst per pool configuration (the first is the headline)."""
    baseline = await burst_create_per_rollout(make_backend(1), n)
    result: dict[str, Any] = {
        "rollouts": n,
        "create_per_rollout": {"ttfe": stats_ms(baseline)},
        "pools": {},
        "_samples": {"create per rollout": baseline},
    }
    for seed, (label, kw) in enumerate(pools.items(), start=2):
        run = await burst_pool(make_backend(seed), n, **kw)
        result["pools"][label] = {
            "config": kw,
            "ttfe": stats_ms(run["ttfe"]),
            "lease_wait_in_burst": stats_ms(run["lease_wait"]),
            **{k: run[k] for k in ("warmup_seconds", "warm_hits", "cold_waits", "warm_hit_rate", "max_alive")},
            "ratio_ttfe_p50": round(percentile(baseline, 50) / percentile(run["ttfe"], 50), 1),
            "ratio_ttfe_p99": round(percentile(baseline, 99) / percentile(run["ttfe"], 99), 1),
        }
        result["_samples"][label] = run["ttfe"]
    result["warm_lease"] = stats_ms(await warm_lease_latency(make_backend(99), min(n, 256)))
    return result


async def local_available() -> str | None:
    try:
        async with cwa.Session(backend="local") as s, s.sandbox() as sb:
            await sb.exec(["true"])
    except cwa.SandboxBackendUnavailableError as exc:
        return str(exc)
    return None


def chart(results: dict[str, Any]) -> None:
    """Write benchmarks/out/pool.png (``charts.pool_cdf``)."""
    import matplotlib.pyplot as plt

    from .charts import pool_cdf

    fig = pool_cdf(results)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    fig.savefig(OUT_DIR / "pool.png", dpi=110, bbox_inches="tight")
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="startup latency scaled by 0.1, fewer local rollouts")
    parser.add_argument("--no-local", action="store_true", help="skip the local backend")
    parser.add_argument("--local-rollouts", type=int, default=None, help="burst size on the local backend")
    parser.add_argument("--rate-rollouts", type=int, default=None, help="rollouts per fresh-vs-reuse run (local)")
    parser.add_argument("--rate-concurrency", type=int, default=8, help="rollouts at a time, fresh-vs-reuse (local)")
    args = parser.parse_args()
    scale = 0.1 if args.quick else 1.0

    results: dict[str, Any] = {"quick": args.quick, "startup_scale": scale}
    print(f"FakeBackend: burst of {BURST}, startup lognormal median {scale:g} s p99 {5 * scale:g} s", flush=True)
    fake_pools = {
        "warm pool": {"size": BURST, "max_size": 2 * BURST},
        "pool at 1/4 of the burst": {"size": BURST // 4, "max_size": BURST},
    }
    results["fake"] = anyio.run(scenario, lambda seed: fake_backend(scale, seed), BURST, fake_pools)

    local_n = args.local_rollouts or (32 if args.quick else BURST)
    reason = "skipped (--no-local)" if args.no_local else anyio.run(local_available)
    if reason is None:
        print(f"local backend: burst of {local_n}", flush=True)
        # The default pool paces creations by their measured cost (no rate limit); the variant runs
        # as many at once as the burst asks for.
        local_pools = {
            "warm pool": {"size": local_n, "max_size": local_n + 32},
            "warm pool, refills not paced": {
                "size": local_n,
                "max_size": local_n + 32,
                "create_concurrency": local_n + 32,
            },
        }
        results["local"] = anyio.run(scenario, lambda seed: "local", local_n, local_pools)
        rate_n = args.rate_rollouts or (64 if args.quick else 400)
        print(f"local backend: {rate_n} rollouts, {args.rate_concurrency} at a time, fresh vs reuse", flush=True)
        results["local_rate"] = anyio.run(lambda: fresh_vs_reuse("local", n=rate_n, concurrency=args.rate_concurrency))
    else:
        results["local"] = {"skipped": reason}
        print(f"local backend: {reason}")

    headline: dict[str, Any] = {}
    for name in ("fake", "local"):
        r = results[name]
        if "pools" not in r:
            continue
        main_pool = r["pools"]["warm pool"]
        headline[f"{name}_ttfe_p50_ratio"] = main_pool["ratio_ttfe_p50"]
        headline[f"{name}_ttfe_p99_ratio"] = main_pool["ratio_ttfe_p99"]
        headline[f"{name}_pool_ttfe_p99_ms"] = main_pool["ttfe"]["p99_ms"]
        headline[f"{name}_per_rollout_ttfe_p99_ms"] = r["create_per_rollout"]["ttfe"]["p99_ms"]
        headline[f"{name}_warm_lease_p50_ms"] = r["warm_lease"]["p50_ms"]
        headline[f"{name}_warm_lease_p99_ms"] = r["warm_lease"]["p99_ms"]
        headline[f"{name}_burst_warm_hit_rate"] = main_pool["warm_hit_rate"]
    rate = results.get("local_rate")
    if rate is not None:
        for workload in ("true", "python"):
            headline[f"local_fresh_to_reuse_ratio_{workload}"] = rate[workload]["ratio_fresh_to_reuse"]
            headline[f"local_fresh_warm_hit_rate_{workload}"] = rate[workload]["fresh"]["warm_hit_rate"]
    results["headline"] = headline

    chart(results)
    for r in results.values():
        if isinstance(r, dict):
            r.pop("_samples", None)
    path = write_json("pool", results)

    print("\n| backend | time to first exec | p50 ms | p99 ms | ratio p50 | ratio p99 |\n|---|---|---|---|---|---|")
    for name in ("fake", "local"):
        r = results[name]
        if "pools" not in r:
            continue
        base = r["create_per_rollout"]["ttfe"]
        print(f"| {name} | create per rollout | {base['p50_ms']:.1f} | {base['p99_ms']:.1f} | 1 | 1 |")
        for label, p in r["pools"].items():
            t = p["ttfe"]
            ratios = f"{p['ratio_ttfe_p50']}x | {p['ratio_ttfe_p99']}x"
            print(f"| {name} | {label} | {t['p50_ms']:.1f} | {t['p99_ms']:.1f} | {ratios} |")
        wl = r["warm_lease"]
        print(f"| {name} | (warm lease latency) | {wl['p50_ms']:.3f} | {wl['p99_ms']:.3f} | | |")
    if rate is not None:
        print("\nlocal backend, rollouts per second (fresh sandbox per lease vs reuse=True, same run):")
        print(table(rate))
    print(f"\nwrote {path} and {OUT_DIR / 'pool.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
