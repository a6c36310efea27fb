"""N concurrent agent rollouts on the local backend, each in a fresh sandbox, against one rollout alone.

Each rollout leases a fresh sandbox from a ``SandboxPool`` (the default: a new sandbox per lease) and
plays a 20-turn episode of tool calls through ``integrations.run_tool`` (the ART agent path: ``bash``,
``write_file``, ``read_file`` in turn), waiting a simulated model latency of 0.5-2 s (seeded) before
each turn. The baseline is the same episode with one rollout, in the same run, first. Reported:
p50/p99 tool-call latency (both), peak memory (PSS summed over this process and every process under
it: the template and every sandbox), failures (a tool call that raised or was not ``ok``), and
what is left after close (sandbox processes under this process, the backend's sandboxes).

    python -m benchmarks.bench_rollouts [--quick] [--rollouts N] [--turns N]

Writes ``benchmarks/out/rollouts.json`` (headline: ``p99_ratio``, ``peak_pss_gib``, ``failures``).
"""

from __future__ import annotations

import argparse
import os
import random
import time
from typing import Any

import anyio

import cwsandbox_async as cwa
from cwsandbox_async.integrations._tools import run_tool

from ._common import percentile, write_json
from ._procstat import measure_trees, raise_nofile, tree


def call(turn: int, rid: int) -> dict[str, Any]:
    """The model's tool call for ``turn``: bash, write_file, read_file in turn."""
    kind = turn % 3
    if kind == 0:
        return {"name": "bash", "arguments": {"command": f"echo turn {turn} rollout {rid} && ls -1 | head -5"}}
    if kind == 1:
        return {
            "name": "write_file",
            "arguments": {"path": f"notes_{turn}.txt", "content": f"rollout {rid} turn {turn}\n" * 20},
        }
    return {"name": "read_file", "arguments": {"path": f"notes_{turn - 1}.txt"}}


class Run:
    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self.done = 0


async def rollout(pool: cwa.SandboxPool, rid: int, turns: int, seed: int, run: Run) -> None:
    rng = random.Random(seed * 100_003 + rid)
    try:
        async with pool.lease() as sb:
            for turn in range(turns):
                await anyio.sleep(rng.uniform(0.5, 2.0))  # the model thinks
                t = time.perf_counter()
                result = await run_tool(sb, call(turn, rid), timeout_seconds=60)
                run.latencies.append(time.perf_counter() - t)
                if not result.ok:
                    run.failures.append(f"rollout {rid} turn {turn}: {result.observation[:200]}")
        run.done += 1
    except Exception as exc:  # a failure is counted, never hidden
        run.failures.append(f"rollout {rid}: {type(exc).__name__}: {exc}"[:300])


async def sample_memory(peak: dict[str, Any], stop: anyio.Event, every: float) -> None:
    while not stop.is_set():
        t = measure_trees([os.getpid()])
        if t.kb["Pss"] > peak.get("pss_kb", 0):
            peak.update(pss_kb=t.kb["Pss"], rss_kb=t.kb["Rss"], processes=t.processes)
        with anyio.move_on_after(every):
            await stop.wait()


async def episode_set(n: int, turns: int, seed: int, sample_every: float) -> dict[str, Any]:
    run = Run()
    peak: dict[str, Any] = {}
    stop = anyio.Event()
    start = time.perf_counter()
    async with cwa.Session(backend="local", handle_signals=False) as session:
        async with cwa.SandboxPool(session, size=0, max_size=n, lease_timeout_seconds=600) as pool:
            async with anyio.create_task_group() as tg:
                tg.start_soon(sample_memory, peak, stop, sample_every)
                async with anyio.create_task_group() as inner:
                    for rid in range(n):
                        inner.start_soon(rollout, pool, rid, turns, seed, run)
                stop.set()
            stats = pool.statistics()
        left_in_backend = len(session.backend._boxes)  # type: ignore[attr-defined]
    wall = time.perf_counter() - start
    left_processes = [p for p, _ in tree(os.getpid()) if p != os.getpid()]
    lat = run.latencies
    return {
        "rollouts": n,
        "turns": turns,
        "completed": run.done,
        "tool_calls": len(lat),
        "failures": len(run.failures),
        "failure_samples": run.failures[:10],
        "tool_ms": {
            "p50": round(percentile(lat, 50) * 1e3, 2),
            "p90": round(percentile(lat, 90) * 1e3, 2),
            "p99": round(percentile(lat, 99) * 1e3, 2),
            "max": round(max(lat) * 1e3, 2) if lat else None,
        },
        "peak_pss_mib": round(peak.get("pss_kb", 0) / 1024, 1),
        "peak_rss_mib": round(peak.get("rss_kb", 0) / 1024, 1),
        "peak_processes": peak.get("processes", 0),
        "max_alive": stats.max_alive,
        "wall_s": round(wall, 1),
        "left_after_close": {"processes": len(left_processes), "sandboxes_in_backend": left_in_backend},
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 rollouts")
    parser.add_argument("--rollouts", type=int, default=None)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    n = args.rollouts or (100 if args.quick else 1000)
    raise_nofile()
    load_before = os.getloadavg()
    base = await episode_set(1, args.turns, args.seed, 1.0)
    print(f"1 rollout   {base['tool_ms']}  peak PSS {base['peak_pss_mib']} MiB", flush=True)
    many = await episode_set(n, args.turns, args.seed, 3.0)
    print(
        f"{n} rollouts {many['tool_ms']}  peak PSS {many['peak_pss_mib']} MiB over {many['peak_processes']} processes, "
        f"failures {many['failures']}, left {many['left_after_close']}, wall {many['wall_s']} s",
        flush=True,
    )
    for line in many["failure_samples"]:
        print("  ", line)
    headline = {
        "p50_ratio": round(many["tool_ms"]["p50"] / base["tool_ms"]["p50"], 2),
        "p99_ratio": round(many["tool_ms"]["p99"] / base["tool_ms"]["p99"], 2),
        "peak_pss_gib": round(many["peak_pss_mib"] / 1024, 3),
        "failures": many["failures"],
        "left_processes": many["left_after_close"]["processes"],
    }
    path = write_json(
        "rollouts",
        {
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
            "baseline_one_rollout": base,
            "concurrent": many,
            "goal": {"p99_ratio": "<= 2", "peak_memory_gib": "<= 2.5", "failures": 0},
            "headline": headline,
        },
    )
    print(f"headline {headline} -> {path}")


if __name__ == "__main__":
    anyio.run(main)
