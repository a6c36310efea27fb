"""Soak: a training-loop-shaped workload for minutes; memory must stay flat and nothing may leak.

    python -m benchmarks.soak                 # 5 minutes on the local backend
    python -m benchmarks.soak --quick         # 30 seconds
    python -m benchmarks.soak --backend fake  # the orchestration layers alone (no processes)

Each round is one "training step": a batch of rollouts through the gatherer, each
leasing a warm sandbox from a pool (reused after a reset) and running a command,
a Python snippet and a file round trip; a few fresh sandboxes created and stopped
outside the pool; then ``log_metrics(step)``. Every ``--sample-seconds`` the
driver's RSS, open file descriptors, asyncio tasks, threads and child processes
are sampled.

Pass criteria (exit code 1 if any fails): after the warm-up (the first fifth of
the run), RSS grows by less than ``--max-growth-mib`` between the median of the
first three samples and the median of the last three; every rollout succeeded
with its own output; at the end file descriptors, tasks and child processes are
back at their baseline and no sandbox is left. The ratio printed is RSS at the
end over RSS after warm-up. Results go to ``benchmarks/out/soak.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

import cwsandbox_async as cwa

from ._common import write_json

MIB = 1024 * 1024


def rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def children() -> int:
    """Live descendants of this process (all sandbox processes are)."""
    seen: set[int] = set()
    todo = [os.getpid()]
    while todo:
        pid = todo.pop()
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    kids = [int(x) for x in f.read().split()]
            except OSError:
                continue
            for kid in kids:
                if kid not in seen:
                    seen.add(kid)
                    todo.append(kid)
    return len(seen)


def sample(start: float, rounds: int, rollouts: int) -> dict[str, float]:
    gc.collect()
    return {
        "t": round(time.monotonic() - start, 1),
        "rss_mib": round(rss() / MIB, 2),
        "fds": fds(),
        "tasks": len(asyncio.all_tasks()),
        "threads": threading.active_count(),
        "children": children(),
        "rounds": rounds,
        "rollouts": rollouts,
    }


def backend_for(name: str) -> Any:
    if name == "fake":
        from cwsandbox_async.testing import FakeBackend, Latency

        return FakeBackend(create_latency=Latency.uniform(0.001, 0.01), exec_latency=Latency.uniform(0.0, 0.002))
    return name


async def reset(sb: cwa.Sandbox) -> None:
    await sb.exec(["rm", "-f", "/workspace/in.txt"], timeout_seconds=10)


async def soak(args: argparse.Namespace) -> dict[str, Any]:
    tag = f"soak-{uuid.uuid4().hex[:8]}"
    defaults = cwa.SandboxDefaults(tags=(tag,))
    backend = backend_for(args.backend)
    failures: list[str] = []
    samples: list[dict[str, float]] = []
    baseline = {"fds": fds(), "tasks": len(asyncio.all_tasks()), "children": children()}
    start = time.monotonic()
    rounds = rollouts = 0
    async with cwa.Session(defaults, backend=backend, report_to=["log"], handle_signals=False) as s:
        async with cwa.SandboxPool(s, size=args.pool, max_size=2 * args.pool, reuse=True, reset=reset) as pool:
            await pool.wait_ready(timeout_seconds=120)

            def rollout(i: int) -> Callable[[], Awaitable[str]]:
                async def run() -> str:
                    async with pool.lease(timeout_seconds=120) as sb:
                        await sb.write_file("/workspace/in.txt", f"{i}\n".encode())
                        r = await sb.exec(["cat", "/workspace/in.txt"], timeout_seconds=30)
                        if args.backend != "fake":  # the fake backend runs no Python
                            p = await sb.run_python(f"print({i} * 2)", timeout_seconds=30)
                            if p.stdout != f"{i * 2}\n":
                                raise AssertionError(f"rollout {i}: run_python printed {p.stdout!r}")
                        return r.stdout

                return run

            async def fresh() -> None:
                async with s.sandbox() as sb:
                    await sb.exec(["true"], timeout_seconds=30)

            next_sample = 0.0
            while (elapsed := time.monotonic() - start) < args.seconds:
                if elapsed >= next_sample:
                    samples.append(sample(start, rounds, rollouts))
                    next_sample += args.sample_seconds
                base = rollouts
                outcomes = await cwa.gather(
                    {base + k: rollout(base + k) for k in range(args.batch)}, limit=args.concurrency
                )
                for o in outcomes:
                    if not o.ok or o.value != f"{o.key}\n":
                        failures.append(f"rollout {o.key}: {o.kind.value} {o.error!r} {o.value!r}")
                rollouts += len(outcomes)
                for o in await cwa.gather([fresh for _ in range(args.fresh)], limit=args.fresh):
                    if not o.ok:
                        failures.append(f"fresh sandbox: {o.error!r}")
                s.log_metrics(rounds)
                rounds += 1
            samples.append(sample(start, rounds, rollouts))
        left = await s.list()
    with anyio.move_on_after(10):  # asyncio's watcher threads wind down
        while children() > baseline["children"]:  # noqa: ASYNC110 - processes offer no event
            await anyio.sleep(0.05)
    end = {"fds": fds(), "tasks": len(asyncio.all_tasks()), "children": children()}

    warm = [x for x in samples if x["t"] >= args.seconds / 5] or samples
    first = statistics.median(x["rss_mib"] for x in warm[:3])
    last = statistics.median(x["rss_mib"] for x in warm[-3:])
    growth = last - first
    checks = {
        "rss_growth_ok": growth < args.max_growth_mib,
        "all_rollouts_ok": not failures,
        "fds_back": end["fds"] == baseline["fds"],
        "tasks_back": end["tasks"] == baseline["tasks"],
        "children_back": end["children"] == baseline["children"],
        "no_sandbox_left": not left,
    }
    return {
        "backend": args.backend,
        "seconds": args.seconds,
        "rounds": rounds,
        "rollouts": rollouts,
        "rollouts_per_second": round(rollouts / (time.monotonic() - start), 1),
        "rss_after_warmup_mib": first,
        "rss_end_mib": last,
        "rss_growth_mib": round(growth, 2),
        "rss_end_over_warmup_ratio": round(last / first, 4) if first else None,
        "baseline": baseline,
        "end": end,
        "checks": checks,
        "failures": failures[:20],
        "samples": samples,
        "headline": {
            "rollouts_per_s": round(rollouts / (time.monotonic() - start), 1),
            "rss_growth_mib": round(growth, 2),
            "rss_end_over_warmup_ratio": round(last / first, 4) if first else None,
            "passed": all(checks.values()),
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="30 seconds instead of 5 minutes")
    parser.add_argument("--seconds", type=float, default=None, help="how long to run (default 300)")
    parser.add_argument("--backend", choices=("local", "fake"), default="local")
    parser.add_argument("--pool", type=int, default=8, help="warm sandboxes in the pool")
    parser.add_argument("--batch", type=int, default=64, help="rollouts per round")
    parser.add_argument("--concurrency", type=int, default=32, help="rollouts in flight")
    parser.add_argument("--fresh", type=int, default=2, help="fresh sandboxes created per round")
    parser.add_argument("--sample-seconds", type=float, default=None, help="sampling interval")
    parser.add_argument("--max-growth-mib", type=float, default=32.0, help="allowed RSS growth after warm-up")
    args = parser.parse_args()
    if args.seconds is None:
        args.seconds = 30.0 if args.quick else 300.0
    if args.sample_seconds is None:
        args.sample_seconds = max(1.0, args.seconds / 60)
    result = asyncio.run(soak(args))
    path = write_json("soak", result)
    print(
        f"soak on {result['backend']}: {result['rollouts']} rollouts in {result['rounds']} rounds "
        f"({result['rollouts_per_second']}/s) over {result['seconds']:g} s"
    )
    print(
        f"RSS after warm-up {result['rss_after_warmup_mib']:.1f} MiB, at the end {result['rss_end_mib']:.1f} MiB "
        f"(growth {result['rss_growth_mib']:+.1f} MiB, ratio {result['rss_end_over_warmup_ratio']})"
    )
    for name, ok in result["checks"].items():
        print(f"  {'ok  ' if ok else 'FAIL'} {name}")
    for line in result["failures"]:
        print(f"  {line}")
    print(f"wrote {path}")
    return 0 if all(result["checks"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
