"""Library overhead: the gatherer against bare asyncio, and the full stack on a zero-latency FakeBackend.

1. 100,000 trivial awaitables (``async def f(): return 1``) through
   ``cwa.as_completed`` / ``cwa.gather`` versus one bare ``asyncio.gather`` of the
   same coroutines. Ratio = gatherer rate / asyncio rate (above 1: faster).
2. Full stack: ``Session(backend=FakeBackend())`` with zero latency, execs of
   ``true`` through the gatherer (bounded, with metrics), each exec in a sandbox
   leased from a ``SandboxPool`` (reused without and with ``check_on_lease``, and
   fresh per lease), or on one sandbox per worker; against two baselines measured
   in the same run: bare asyncio tasks doing nothing (``asyncio.gather`` of empty
   coroutines), and bare asyncio tasks calling ``FakeBackend.exec`` directly (the
   fake's own cost, no library).

Each figure is the best of several runs, each on a fresh event loop with GC paused.
Wall-clock rates and ratios are the headline; the same ratios on the process's CPU
time are reported too (``cpu_*``): on a shared machine they move less, since time
spent waiting for a core is not counted. Writes benchmarks/out/overhead.json.
``--profile`` prints where the full stack's time goes (cProfile, top functions by
own time; cProfile inflates small functions, so read it for proportions).

    python -m benchmarks.bench_overhead [--quick] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import pstats
import time
from collections.abc import Awaitable, Callable
from typing import Any

import cwsandbox_async as cwa
from cwsandbox_async._types import ExecRequest
from cwsandbox_async.testing import FakeBackend

from ._common import write_json

WORKERS = 128


async def _trivial() -> int:
    return 1


async def _nothing() -> None:
    return None


def best_of(repeats: int, run: Callable[[], Awaitable[Any]]) -> float:
    """Best wall time of ``repeats`` runs, each on a fresh event loop, GC paused while timed."""
    return best_wall_and_cpu(repeats, run)[0]


def best_wall_and_cpu(repeats: int, run: Callable[[], Awaitable[Any]]) -> tuple[float, float]:
    """Best wall time and best process CPU time of ``repeats`` runs (fresh event loop each, GC paused)."""
    wall = cpu = float("inf")
    for _ in range(repeats):
        gc.collect()
        gc.disable()
        try:
            start, start_cpu = time.perf_counter(), time.process_time()
            asyncio.run(run())  # type: ignore[arg-type]
            wall = min(wall, time.perf_counter() - start)
            cpu = min(cpu, time.process_time() - start_cpu)
        finally:
            gc.enable()
    return wall, cpu


# -- 1. trivial awaitables ------------------------------------------------------------


async def bare_gather(n: int) -> None:
    await asyncio.gather(*[_trivial() for _ in range(n)])


async def via_as_completed(n: int) -> None:
    async with cwa.as_completed([_trivial() for _ in range(n)], limit=WORKERS, progress=False) as results:
        async for _ in results:
            pass


async def via_gather(n: int) -> None:
    await cwa.gather([_trivial() for _ in range(n)], limit=WORKERS, progress=False)


async def via_as_completed_factories(n: int) -> None:
    async with cwa.as_completed((_trivial for _ in range(n)), limit=WORKERS, progress=False) as results:
        async for _ in results:
            pass


# -- 2. full stack ------------------------------------------------------------------------


async def bare_tasks(n: int) -> None:
    await asyncio.gather(*[_nothing() for _ in range(n)])


async def bare_backend_exec(n: int) -> None:
    """Bounded bare asyncio tasks calling the fake's exec directly: no session, sandbox, gatherer or metrics."""
    backend = FakeBackend()
    session = cwa.Session(backend=backend, handle_signals=False)
    async with session:
        sb = await session.sandbox()
        req = ExecRequest(argv=("true",), cwd="/workspace", env={}, stdin=None, timeout_seconds=30.0,
                          max_output_bytes=1 << 20)  # fmt: skip
        sem = asyncio.Semaphore(WORKERS)

        async def one() -> None:
            async with sem:
                await backend.exec(sb.sandbox_id, req)

        await asyncio.gather(*[one() for _ in range(n)])


async def stack_pool(n: int, *, reuse: bool, check: bool = False) -> None:
    session = cwa.Session(backend=FakeBackend(), handle_signals=False)
    async with session, cwa.SandboxPool(session, size=WORKERS, reuse=reuse, check_on_lease=check) as pool:
        await pool.wait_ready()

        async def rollout() -> cwa.ExecResult:
            async with pool.lease() as sb:
                return await sb.exec(["true"])

        outcomes = await cwa.gather((rollout for _ in range(n)), limit=WORKERS, metrics=session.metrics, progress=False)
    assert len(outcomes) == n and all(o.ok for o in outcomes), [o for o in outcomes if not o.ok][:3]


async def stack_sandbox_per_worker(n: int) -> None:
    async with cwa.Session(backend=FakeBackend(), handle_signals=False) as session:
        sandboxes = [await session.sandbox() for _ in range(WORKERS)]

        def item(i: int) -> Callable[[], Awaitable[cwa.ExecResult]]:
            return lambda: sandboxes[i % WORKERS].exec(["true"])

        outcomes = await cwa.gather((item(i) for i in range(n)), limit=WORKERS, metrics=session.metrics, progress=False)
    assert len(outcomes) == n and all(o.ok for o in outcomes)


def profile(n: int) -> str:
    prof = cProfile.Profile()
    prof.enable()
    asyncio.run(stack_pool(n, reuse=True))
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run (fewer items, fewer repeats)")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of the full stack")
    args = parser.parse_args()
    n_trivial = 20_000 if args.quick else 100_000
    n_stack = 5_000 if args.quick else 100_000
    n_fresh = n_stack // 5  # a create and a destroy per exec: slower, so fewer
    repeats = 2 if args.quick else 3

    rate: dict[str, float] = {}
    cpu_rate: dict[str, float] = {}

    def measure(name: str, n: int, run: Callable[[], Awaitable[Any]]) -> None:
        seconds, cpu = best_wall_and_cpu(repeats, run)
        rate[name] = n / seconds
        cpu_rate[name] = n / cpu
        print(
            f"  {name:<38} {n / seconds:>10,.0f} /s   ({seconds:.3f} s for {n:,}; {cpu / n * 1e6:6.2f} µs CPU each)",
            flush=True,
        )

    print(f"trivial awaitables ({n_trivial:,}):")
    measure("asyncio.gather (baseline)", n_trivial, lambda: bare_gather(n_trivial))
    measure("cwa.as_completed (coroutines)", n_trivial, lambda: via_as_completed(n_trivial))
    measure("cwa.as_completed (factories)", n_trivial, lambda: via_as_completed_factories(n_trivial))
    measure("cwa.gather", n_trivial, lambda: via_gather(n_trivial))

    print(f"full stack, zero-latency FakeBackend ({n_stack:,} execs, {WORKERS} at once):")
    measure("bare asyncio tasks doing nothing", n_stack, lambda: bare_tasks(n_stack))
    measure("bare tasks -> FakeBackend.exec", n_stack, lambda: bare_backend_exec(n_stack))
    measure("stack: pool(reuse) + gather + metrics", n_stack, lambda: stack_pool(n_stack, reuse=True))
    measure("stack: pool(reuse, checked) + gather", n_stack, lambda: stack_pool(n_stack, reuse=True, check=True))
    measure("stack: pool(fresh) + gather + metrics", n_fresh, lambda: stack_pool(n_fresh, reuse=False))
    measure("stack: sandbox/worker + gather", n_stack, lambda: stack_sandbox_per_worker(n_stack))

    base_trivial = rate["asyncio.gather (baseline)"]
    base_tasks = rate["bare asyncio tasks doing nothing"]
    base_exec = rate["bare tasks -> FakeBackend.exec"]
    ratios = {
        "as_completed_vs_asyncio_gather_ratio": rate["cwa.as_completed (coroutines)"] / base_trivial,
        "as_completed_factories_vs_asyncio_gather_ratio": rate["cwa.as_completed (factories)"] / base_trivial,
        "gather_vs_asyncio_gather_ratio": rate["cwa.gather"] / base_trivial,
        "stack_pool_reuse_vs_bare_tasks_ratio": rate["stack: pool(reuse) + gather + metrics"] / base_tasks,
        "stack_pool_checked_vs_bare_tasks_ratio": rate["stack: pool(reuse, checked) + gather"] / base_tasks,
        "stack_pool_fresh_vs_bare_tasks_ratio": rate["stack: pool(fresh) + gather + metrics"] / base_tasks,
        "stack_per_worker_vs_bare_tasks_ratio": rate["stack: sandbox/worker + gather"] / base_tasks,
        "stack_pool_reuse_vs_bare_backend_exec_ratio": rate["stack: pool(reuse) + gather + metrics"] / base_exec,
        "stack_per_worker_vs_bare_backend_exec_ratio": rate["stack: sandbox/worker + gather"] / base_exec,
    }
    cpu_ratios = {
        "cpu_stack_pool_reuse_vs_bare_tasks_ratio": cpu_rate["stack: pool(reuse) + gather + metrics"]
        / cpu_rate["bare asyncio tasks doing nothing"],
        "cpu_stack_pool_checked_vs_bare_tasks_ratio": cpu_rate["stack: pool(reuse, checked) + gather"]
        / cpu_rate["bare asyncio tasks doing nothing"],
        "cpu_stack_pool_fresh_vs_bare_tasks_ratio": cpu_rate["stack: pool(fresh) + gather + metrics"]
        / cpu_rate["bare asyncio tasks doing nothing"],
        "cpu_stack_per_worker_vs_bare_tasks_ratio": cpu_rate["stack: sandbox/worker + gather"]
        / cpu_rate["bare asyncio tasks doing nothing"],
    }
    print("ratios (library rate / baseline rate; 1.0 = as fast; cpu_: on process CPU time):")
    for key, value in {**ratios, **cpu_ratios}.items():
        print(f"  {key:<48} {value:.2f}")
    data: dict[str, Any] = {
        "quick": args.quick,
        "workers": WORKERS,
        "n_trivial": n_trivial,
        "n_stack": n_stack,
        "rates_per_second": {k: round(v) for k, v in rate.items()},
        "cpu_rates_per_second": {k: round(v) for k, v in cpu_rate.items()},
        **{k: round(v, 3) for k, v in ratios.items()},
        **{k: round(v, 3) for k, v in cpu_ratios.items()},
        "headline": {
            "as_completed_vs_asyncio_gather_ratio": round(ratios["as_completed_vs_asyncio_gather_ratio"], 3),
            "stack_execs_per_s": round(rate["stack: pool(reuse) + gather + metrics"]),
            "stack_vs_bare_tasks_ratio": round(ratios["stack_pool_reuse_vs_bare_tasks_ratio"], 3),
            "stack_vs_bare_tasks_cpu_ratio": round(cpu_ratios["cpu_stack_pool_reuse_vs_bare_tasks_ratio"], 3),
        },
    }
    if args.profile:
        text = profile(n_stack // 5)
        print(text)
        data["profile_top"] = text.splitlines()[:45]
    path = write_json("overhead", data)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
