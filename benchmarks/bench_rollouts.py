"""N concurrent agent rollouts on the local backend, each in a fresh sandbox, against one rollout alone.

Each rollout leases a fresh sandbox from a ``SandboxPool`` and plays a 20-turn episode of tool calls
through ``integrations.run_tool`` (the ART agent path: ``bash``, ``write_file``, ``read_file`` in
turn), waiting a simulated model latency of 0.5-2 s (seeded) before each turn.

The N are live at once: the pool is warmed to N fresh sandboxes (``size=N, max_size=N``, then
``wait_ready``, as a user would) before any tool call, every rollout leases its sandbox, and all
start their episode together once the last one has it (the pool is then resized to ``size=0`` so
a released sandbox is not replaced while others still play). Warm-up and episode are timed apart.
The baseline is the same episode with one rollout, run first on the otherwise idle machine,
repeated sequentially ``--baseline-episodes`` times (a fresh sandbox each) so its p99 is not a
single call. Reported: p50/p99 tool-call latency (both), sandboxes alive at once (peak, and leased
when the episode started), peak memory (PSS summed over this process and every process under it:
the template and every sandbox), failures (a tool call that raised or was not ``ok``, a rollout
that got no sandbox, a warm-up that failed), and what is left after close (sandbox processes under
this process, the backend's sandboxes), and the CPU per tool call (summed
over the episodes, in a cpuacct group of the run's own that holds this process, everything it starts
and every sandbox; the machine's busy CPU where no such group can be made): what one call costs all in.

``--host`` also plays the same episodes, one and N at once, with no sandbox: ``bash -c`` as a host
subprocess (``asyncio``) in a directory of each rollout's own, files read and written by the driver.
That is what a user would run instead, and the limit of these cores: at N at once it shows how much
of the latency is the offered load itself.

    python -m benchmarks.bench_rollouts [--quick] [--rollouts N] [--turns N] [--baseline-episodes N] [--host]

Writes ``benchmarks/out/rollouts.json`` (headline: ``p50_ratio``, ``p99_ratio``, ``peak_pss_gib``,
``failures``, ``peak_alive``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import tempfile
import time
from typing import Any

import anyio

import cwsandbox_async as cwa
from cwsandbox_async.integrations._tools import run_tool

from ._common import percentile, write_json
from ._cpu import AcctGroup
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


#: This run's own cpuacct group (this process, and so every process it starts and every sandbox), or
#: None where there is none to make: then the machine's busy CPU is read instead.
ACCT: AcctGroup | None = None


def cpu_seconds() -> float:
    """CPU seconds used so far by this run's processes (``ACCT``), else by the whole machine."""
    if ACCT is not None:
        return ACCT.usage() / 1e9
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in f.readline().split()[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


async def host_tool(workdir: str, tool: dict[str, Any]) -> bool:
    """The same tool call with no sandbox: ``bash -c`` as a host subprocess, files by the driver."""
    name, args = tool["name"], tool["arguments"]
    if name == "bash":
        proc = await asyncio.create_subprocess_exec(
            "bash", "-c", args["command"], cwd=workdir, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        await proc.communicate()
        return proc.returncode == 0
    # In the loop itself: a small local file is microseconds, the cheapest a harness can do.
    return _file_tool(os.path.join(workdir, args["path"]), args.get("content"))


def _file_tool(path: str, content: str | None) -> bool:
    if content is not None:
        with open(path, "w") as f:
            f.write(content)
        return True
    with open(path) as f:
        return bool(f.read())


class Run:
    """What a set of rollouts measured, and the gate at which they start their episode together."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self.done = 0
        self.waiting = 0  # rollouts of this set that have neither their sandbox nor failed to get one
        self.go = anyio.Event()

    def arrive(self) -> None:
        """A rollout has its sandbox (or will never have one); the last to arrive opens the gate."""
        self.waiting -= 1
        if self.waiting == 0:
            self.go.set()


async def rollout(pool: cwa.SandboxPool, rid: int, turns: int, seed: int, run: Run) -> None:
    rng = random.Random(seed * 100_003 + rid)
    arrived = False
    try:
        async with pool.lease() as sb:
            run.arrive()
            arrived = True
            await run.go.wait()
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
    finally:
        if not arrived:
            run.arrive()


async def host_rollout(rid: int, turns: int, seed: int, run: Run) -> None:
    rng = random.Random(seed * 100_003 + rid)
    workdir = tempfile.mkdtemp(prefix="bench-rollout-")
    try:
        await run.go.wait()
        for turn in range(turns):
            await anyio.sleep(rng.uniform(0.5, 2.0))  # the model thinks
            t = time.perf_counter()
            ok = await host_tool(workdir, call(turn, rid))
            run.latencies.append(time.perf_counter() - t)
            if not ok:
                run.failures.append(f"rollout {rid} turn {turn}: failed")
        run.done += 1
    except Exception as exc:  # a failure is counted, never hidden
        run.failures.append(f"rollout {rid}: {type(exc).__name__}: {exc}"[:300])
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


async def host_episode_set(n: int, episodes: int, turns: int, seed: int) -> dict[str, Any]:
    """The same ``episodes`` sets of ``n`` rollouts with no sandbox (see the module docstring)."""
    run = Run()
    start, busy = time.perf_counter(), 0.0
    for e in range(episodes):
        run.go = anyio.Event()
        busy0 = cpu_seconds()
        async with anyio.create_task_group() as tg:
            for rid in range(e * n, (e + 1) * n):
                tg.start_soon(host_rollout, rid, turns, seed, run)
            run.go.set()
        busy += cpu_seconds() - busy0
    return {
        "rollouts": n,
        "episodes": episodes,
        "completed": run.done,
        "tool_calls": len(run.latencies),
        "failures": len(run.failures),
        "failure_samples": run.failures[:10],
        "tool_ms": latency_ms(run.latencies),
        "cpu_ms_per_call": round(busy / max(1, len(run.latencies)) * 1e3, 2),
        "wall_s": round(time.perf_counter() - start, 1),
    }


def latency_ms(lat: list[float]) -> dict[str, float | None]:
    return {
        "p50": round(percentile(lat, 50) * 1e3, 2),
        "p90": round(percentile(lat, 90) * 1e3, 2),
        "p99": round(percentile(lat, 99) * 1e3, 2),
        "max": round(max(lat) * 1e3, 2) if lat else None,
    }


async def play(session: cwa.Session, rids: range, turns: int, seed: int, run: Run) -> dict[str, Any]:
    """``len(rids)`` rollouts at once: warm a pool to one fresh sandbox each, lease them all, then play."""
    n = len(rids)
    run.waiting, run.go = n, anyio.Event()
    t0 = time.perf_counter()
    async with cwa.SandboxPool(session, size=n, max_size=n, lease_timeout_seconds=600) as pool:
        try:
            await pool.wait_ready(timeout_seconds=1800)
        except cwa.SandboxError as exc:  # counted; the rollouts still lease what the pool can give
            run.failures.append(f"warm-up: {type(exc).__name__}: {exc}"[:300])
        warm = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for rid in rids:
                tg.start_soon(rollout, pool, rid, turns, seed, run)
            await run.go.wait()
            start, busy0 = time.perf_counter(), cpu_seconds()
            leased_at_start = pool.statistics().leased
            await pool.resize(0)  # a released sandbox is not replaced while the others still play
        end, busy = time.perf_counter(), cpu_seconds() - busy0
        peak_alive = pool.statistics().max_alive
    return {
        "cpu_s": round(busy, 2),
        "warmup_s": round(warm - t0, 2),
        "lease_all_s": round(start - warm, 2),
        "episode_s": round(end - start, 2),
        "leased_at_start": leased_at_start,
        "peak_alive": peak_alive,
    }


async def sample_memory(peak: dict[str, Any], stop: anyio.Event, every: float) -> None:
    while not stop.is_set():
        # In a worker thread: reading smaps of a thousand processes would stall the loop's tool calls.
        t = await anyio.to_thread.run_sync(measure_trees, [os.getpid()])
        if t.kb["Pss"] > peak.get("pss_kb", 0):
            peak.update(pss_kb=t.kb["Pss"], rss_kb=t.kb["Rss"], processes=t.processes)
        with anyio.move_on_after(every):
            await stop.wait()


async def episode_set(n: int, episodes: int, turns: int, seed: int, sample_every: float) -> dict[str, Any]:
    """``episodes`` sets of ``n`` concurrent rollouts, one after another, in one session."""
    run = Run()
    peak: dict[str, Any] = {}
    stop = anyio.Event()
    sets: list[dict[str, Any]] = []
    start = time.perf_counter()
    async with cwa.Session(backend="local", handle_signals=False) as session:
        async with anyio.create_task_group() as tg:
            tg.start_soon(sample_memory, peak, stop, sample_every)
            for e in range(episodes):
                sets.append(await play(session, range(e * n, (e + 1) * n), turns, seed, run))
            stop.set()
        left_in_backend = len(session.backend._boxes)  # type: ignore[attr-defined]
    wall = time.perf_counter() - start
    left_processes = [p for p, _ in tree(os.getpid()) if p != os.getpid()]
    lat = run.latencies
    return {
        "rollouts": n,
        "episodes": episodes,
        "turns": turns,
        "completed": run.done,
        "tool_calls": len(lat),
        "failures": len(run.failures),
        "failure_samples": run.failures[:10],
        "tool_ms": latency_ms(lat),
        # The run's CPU over the episodes (gate to the last release; not the warm-up), per call.
        "cpu_ms_per_call": round(sum(s["cpu_s"] for s in sets) / max(1, len(lat)) * 1e3, 2),
        "peak_alive": max(s["peak_alive"] for s in sets),
        "leased_at_start": min(s["leased_at_start"] for s in sets),
        "warmup_s": round(sum(s["warmup_s"] + s["lease_all_s"] for s in sets), 2),
        "episode_s": round(sum(s["episode_s"] for s in sets), 2),
        "sets": sets,
        "peak_pss_mib": round(peak.get("pss_kb", 0) / 1024, 1),
        "peak_rss_mib": round(peak.get("rss_kb", 0) / 1024, 1),
        "peak_processes": peak.get("processes", 0),
        "wall_s": round(wall, 1),
        "left_after_close": {"processes": len(left_processes), "sandboxes_in_backend": left_in_backend},
    }


def describe(r: dict[str, Any]) -> str:
    return (
        f"{r['tool_calls']} calls {r['tool_ms']}  alive at once {r['peak_alive']} "
        f"(leased at start {r['leased_at_start']}), warm-up {r['warmup_s']} s, episodes {r['episode_s']} s, "
        f"peak PSS {r['peak_pss_mib']} MiB over {r['peak_processes']} processes, failures {r['failures']}, "
        f"left {r['left_after_close']}, wall {r['wall_s']} s"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 rollouts")
    parser.add_argument("--rollouts", type=int, default=None)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--baseline-episodes", type=int, default=10, help="sequential one-rollout episodes")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--host", action="store_true", help="also the same episodes with no sandbox")
    args = parser.parse_args()
    n = args.rollouts or (100 if args.quick else 1000)
    raise_nofile()
    global ACCT
    ACCT = AcctGroup.make(f"cwsandbox-rollouts-{os.getpid()}")
    if ACCT is not None:
        ACCT.join(os.getpid())
    try:
        await measure(args, n)
    finally:
        if ACCT is not None:
            ACCT.remove()


async def measure(args: argparse.Namespace, n: int) -> None:
    load_before = os.getloadavg()
    base = await episode_set(1, args.baseline_episodes, args.turns, args.seed, 1.0)
    print(f"1 rollout x {args.baseline_episodes} episodes: {describe(base)}", flush=True)
    load_between = os.getloadavg()
    many = await episode_set(n, 1, args.turns, args.seed, 3.0)
    print(f"{n} rollouts at once: {describe(many)}", flush=True)
    host: dict[str, Any] = {}
    if args.host:
        host["one"] = await host_episode_set(1, args.baseline_episodes, args.turns, args.seed)
        print(f"no sandbox, 1 rollout x {args.baseline_episodes} episodes: {host['one']}", flush=True)
        host["many"] = await host_episode_set(n, 1, args.turns, args.seed)
        print(f"no sandbox, {n} rollouts at once: {host['many']}", flush=True)
    for line in [*base["failure_samples"], *many["failure_samples"]]:
        print("  ", line)
    headline = {
        "p50_ratio": round(many["tool_ms"]["p50"] / base["tool_ms"]["p50"], 2),
        "p99_ratio": round(many["tool_ms"]["p99"] / base["tool_ms"]["p99"], 2),
        "baseline_calls": base["tool_calls"],
        "peak_alive": many["peak_alive"],
        "leased_at_start": many["leased_at_start"],
        "warmup_s": many["warmup_s"],
        "episode_s": many["episode_s"],
        "peak_pss_gib": round(many["peak_pss_mib"] / 1024, 3),
        "failures": many["failures"],
        "baseline_failures": base["failures"],
        "left_processes": many["left_after_close"]["processes"],
        "left_sandboxes": many["left_after_close"]["sandboxes_in_backend"],
        "cpu_ms_per_call_one": base["cpu_ms_per_call"],
        "cpu_ms_per_call_many": many["cpu_ms_per_call"],
    }
    if host:
        headline["host_p99_ratio"] = round(host["many"]["tool_ms"]["p99"] / host["one"]["tool_ms"]["p99"], 2)
        headline["p99_vs_host_many"] = round(many["tool_ms"]["p99"] / host["many"]["tool_ms"]["p99"], 2)
        headline["host_cpu_ms_per_call_one"] = host["one"]["cpu_ms_per_call"]
    path = write_json(
        "rollouts",
        {
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_between": [round(x, 2) for x in load_between],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
            "baseline_one_rollout": base,
            "concurrent": many,
            "no_sandbox": host,
            "goal": {"p99_ratio": "<= 2", "peak_memory_gib": "<= 2.5", "failures": 0},
            "headline": headline,
        },
    )
    print(f"headline {headline} -> {path}")


if __name__ == "__main__":
    anyio.run(main)
